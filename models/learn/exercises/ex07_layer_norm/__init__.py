"""Exercise 7: LayerNorm."""

SECTIONS = "8.4, 10.8"  # the notes' sections
# glassgrad's own code that does the same job (`solution 7` prints it)
ENGINE = (
    "autograd.functional:LayerNorm",
    "autograd.kernels.layernorm:layer_norm_backward_numpy",
)

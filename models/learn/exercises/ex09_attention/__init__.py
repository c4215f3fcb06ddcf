"""Exercise 9: Causal attention's backward."""

SECTIONS = "7.4, 10.5-10.7"  # the notes' sections
# glassgrad's own code that does the same job (`solution 9` prints it)
ENGINE = (
    "autograd.functional:_attention_vjp",
    "autograd.functional:MaskedAttention",
)

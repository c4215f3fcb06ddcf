"""Exercise 8: Embedding and gather with repeated ids."""

SECTIONS = "2.1, 10.9"  # the notes' sections
# glassgrad's own code that does the same job (`solution 8` prints it)
ENGINE = (
    "autograd.functional:Embedding",
    "autograd.kernels.embedding:embedding_backward_numpy",
    "autograd.functional:Gather",
)

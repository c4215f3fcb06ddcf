"""Exercise 2: Matmul's VJP."""

SECTIONS = "10.4"  # the notes' sections
# glassgrad's own code that does the same job (`solution 2` prints it)
ENGINE = (
    "autograd.ops:MatMul",
    "autograd.functional:Linear",
)

"""Exercise 3: Elementwise ops and reductions, max with ties."""

SECTIONS = "10.1, 10.2"  # the notes' sections
# glassgrad's own code that does the same job (`solution 3` prints it)
ENGINE = (
    "autograd.ops:Div",
    "autograd.ops:Tanh",
    "autograd.ops:Sum",
    "autograd.ops:Max",
)

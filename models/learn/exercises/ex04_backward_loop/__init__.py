"""Exercise 4: The backward loop itself."""

SECTIONS = "10.2"  # the notes' sections
# glassgrad's own code that does the same job (`solution 4` prints it)
ENGINE = (
    "autograd.tensor:_topological_order",
    "autograd.tensor:run_backward",
)

"""Exercise 1: Unbroadcast: the VJP of broadcasting."""

SECTIONS = "10.2, 10.5"  # the notes' sections
# glassgrad's own code that does the same job (`solution 1` prints it)
ENGINE = ("autograd.tensor:unbroadcast",)

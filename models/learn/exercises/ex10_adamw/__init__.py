"""Exercise 10: The AdamW step."""

SECTIONS = "10.1"  # the notes' sections
# glassgrad's own code that does the same job (`solution 10` prints it)
ENGINE = ("nn.optim:Adam._update",)

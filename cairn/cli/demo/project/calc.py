"""A tiny calculator, with a bug the demo team fixes."""


def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a - b


def mul(a: int, b: int) -> int:
    """Return the product of a and b."""
    return a * b

"""How far apart are two tensors: four common metrics, what each one sees and what it hides,
and the one the gates use (the error in units of a derived bound).

All metrics compare in fp64, so the comparison adds no rounding of its own.
"""

import torch


# --8<-- [start:metrics]
def max_abs(a, b) -> float:
    """max |a - b|: in the units of the data, so it depends on their scale."""
    return (a.double() - b.double()).abs().max().item()


def max_rel(a, b, floor: float = 0.0) -> float:
    """max |a - b| / (|b| + floor): scale-free, but unbounded where b is close to 0."""
    return ((a.double() - b.double()).abs() / (b.double().abs() + floor)).max().item()


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """fp16 / bf16 / fp32 bit patterns mapped to integers that are monotone in the value:
    adjacent representable numbers differ by 1 (IEEE 754 is sign-magnitude; -0 maps to +0)."""
    bits = {2: torch.int16, 4: torch.int32}[t.element_size()]
    i = t.contiguous().view(bits).to(torch.int64)
    magnitude = i & (2 ** (8 * t.element_size() - 1) - 1)
    return torch.where(i < 0, -magnitude, magnitude)


def ulp_distance(a, b) -> torch.Tensor:
    """Elementwise number of representable steps of the (common) dtype between a and b."""
    assert a.dtype == b.dtype, "ULPs are counted in one dtype"
    return (ordered_bits(a) - ordered_bits(b)).abs()


def cosine(a, b) -> float:
    """cos of the angle between a and b flattened: blind to scale (a and 2a give 1.0)."""
    a, b = a.double().flatten(), b.double().flatten()
    return (a @ b / (a.norm() * b.norm())).item()


def bound_ratio(got, exact, bound) -> float:
    """max |got - exact| / bound: the gates' metric; <= 1 passes, whatever the scale or dtype."""
    return ((got.double() - exact.double()).abs() / bound).max().item()


# --8<-- [end:metrics]


# --8<-- [start:demo]
x = torch.tensor([1.0, 1e-3, -2.0, 0.0])
scaled = 2 * x  # a factor-2 bug
print(f"{cosine(scaled, x):.6f}")  # cosine similarity cannot see it
#> 1.000000
nearly_zero = x + 1e-9  # a harmless 1e-9 everywhere
print(max_abs(nearly_zero, x) < 1e-8, max_rel(nearly_zero, x) == float("inf"))
#> True True
one = torch.tensor([1.0], dtype=torch.bfloat16)
step = torch.nextafter(one, torch.tensor([2.0], dtype=torch.bfloat16))  # the next bf16 after 1
print(step.item(), ulp_distance(step, one).item(), ulp_distance(-step, one).item())
#> 1.0078125 1 32513
# --8<-- [end:demo]

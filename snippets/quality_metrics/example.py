"""效果指标：CE、PPL、KL、WER / CER: the central claim of the post, executed."""


# --8<-- [start:demo]
def double(x):
    return 2 * x


assert double(21) == 42
print(double(2))
#> 4
# --8<-- [end:demo]

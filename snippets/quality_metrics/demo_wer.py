"""WER and CER reproduced from jiwer's and NIST sclite's documentation."""

from snippets.quality_metrics.wer import (
    Alignment,
    align,
    chars,
    corpus_rate,
    measures,
    render,
    words,
)

# --8<-- [start:jiwer]
# jiwer's docs/usage.md: two sentences, their alignment drawings and the summary measures
refs = ["short one here", "quite a bit of longer sentence"]
hyps = ["shoe order one", "quite bit of an even longest sentence here"]
pair = [align(words(r), words(h)) for r, h in zip(refs, hyps, strict=True)]
for line in "\n".join(render(a) for a in pair).splitlines():
    print(line)
    #> REF: **** short one here
    #> HYP: shoe order one ****
    #>         I     S        D
    #> REF: quite a bit of ** ****  longer sentence ****
    #> HYP: quite * bit of an even longest sentence here
    #>            D         I    I       S             I
both = Alignment(pair[0].ops + pair[1].ops)  # the counts of both sentences together
print(both.substitutions, both.deletions, both.insertions, both.hits)
#> 2 2 4 5
print(" ".join(f"{k}={v:.2%}" for k, v in measures(both).items()))
#> wer=88.89% mer=61.54% wil=74.75% wip=25.25%
# --8<-- [end:jiwer]

# --8<-- [start:corpus]
# jiwer's multi-sentence example: all errors over all reference words, not a mean of rates
refs = ["hello world", "i like monthy python"]
hyps = ["hello duck", "i like python"]
each = [align(words(r), words(h)) for r, h in zip(refs, hyps, strict=True)]
print(f"{corpus_rate(each):.4f}", f"{sum(a.rate() for a in each) / len(each):.4f}")
#> 0.3333 0.3750

# CER: characters, spaces included (jiwer's default); a Chinese pair
cer = align(chars("今天天气真好"), chars("今天天汽很好啊"))
for line in render(cer, sep="").splitlines():
    print(line)
    #> REF: 今天天气真好**
    #> HYP: 今天天汽很好啊
    #>             S S   I
print(f"{cer.rate():.2%}")
#> 50.00%
# --8<-- [end:corpus]

# --8<-- [start:sclite]
# sclite's documentation (doc/outputs.htm, the dtl report): 1406 reference words,
# 131 substitutions, 12 deletions, 26 insertions, 1263 correct
n, s, d, i, h = 1406, 131, 12, 26, 1263
assert h + s + d == n
print(f"{(s + d + i) / n:.1%} {h / n:.1%} {1 - (s + d + i) / n:.1%}")
#> 12.0% 89.8% 88.0%
# --8<-- [end:sclite]

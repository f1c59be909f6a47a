"""Unit tests for snippets/moe_distillation/: every loss against finite differences, its closed-form
gradient and an independent formula (TRL's GKD loss, DistiLLM's code, PyTorch's cross-entropy),
its end points and limits, its errors on bad input; the on-policy sampler and loss; the storage
and compute account against hand counts; the experiment's loop against the shared trainer and
its whole path on the CPU stand-ins."""

import math

import pytest
import torch
import torch.nn.functional as F

from snippets.common.device import ON_GPU
from snippets.common.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from snippets.common.models.qwen3_moe import QWEN3_30B_A3B, TINY_MOE, Qwen3MoeForCausalLM
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.train import TrainConfig, init_weights, model_config, train
from snippets.moe_distillation import account
from snippets.moe_distillation import losses as L
from snippets.moe_distillation.account import student_config
from snippets.moe_distillation.experiment import (
    CPU_BUDGET,
    METHODS,
    Budget,
    Sampler,
    Student,
    captured_topk_kl,
    loss_fns,
    measure,
    median,
    run_experiment,
    teacher_logprobs,
    teacher_tail,
)
from snippets.moe_distillation.onpolicy import (
    eager_step,
    greedy_continue,
    gumbel_sample,
    on_policy_loss,
    sample_continuations,
    written_positions,
)
from snippets.quality_metrics.divergence import js, kl

F64 = torch.float64


def pair(n=6, v=13, seed=0, scale=2.0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    s = (scale * torch.randn(n, v, generator=g, dtype=F64)).to(dtype)
    t = (scale * torch.randn(n, v, generator=g, dtype=F64)).to(dtype)
    return s, t


MASK = torch.tensor([True, False, True, True, False, True])
TARGETS = torch.tensor([3, 0, 12, 7, 1, 5])
LOSSES = {  # name: (loss(s, t, mask), closed-form keyword arguments)
    "forward_kl": (lambda s, t, m: L.forward_kl_loss(s, t, m, temperature=3.0),
                   {"temperature": 3.0}),
    "reverse_kl": (lambda s, t, m: L.reverse_kl_loss(s, t, m), {}),
    "jsd": (lambda s, t, m: L.jsd_loss(s, t, m, beta=0.3), {"beta": 0.3}),
    "skew_kl": (lambda s, t, m: L.skew_kl_loss(s, t, m, alpha=0.25), {"alpha": 0.25}),
    "skew_rkl": (lambda s, t, m: L.skew_kl_loss(s, t, m, alpha=0.25, reverse=True),
                 {"alpha": 0.25}),
    "topk_kl": (lambda s, t, m: L.topk_kl_loss(s, *L.teacher_topk(t, 5, F64), m,
                                               temperature=0.7), {"k": 5, "temperature": 0.7}),
    "sequence_kd": (lambda s, t, m: L.sequence_kd_loss(s, TARGETS, m), {"targets": TARGETS}),
}  # fmt: skip


# ------------------------------------------------------------------------------ gradients


@pytest.mark.parametrize("name", LOSSES)
def test_gradcheck_in_fp64(name):
    s, t = pair()
    loss, _ = LOSSES[name]
    s.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: loss(x, t, MASK), (s,))


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("seed", range(3))
def test_closed_form_gradient_equals_autograd(name, seed):
    s, t = pair(seed=seed)
    loss, kw = LOSSES[name]
    s.requires_grad_()
    (grad,) = torch.autograd.grad(loss(s, t, MASK), s)
    closed = L.closed_form_grad(name, s.detach(), t, MASK, **kw)
    # both are fp64 sums of a few terms of size <= 1 over 13 tokens: 1e-13 is ~500 ulps
    assert torch.allclose(grad, closed, rtol=0, atol=1e-13)
    assert (grad[~MASK] == 0).all()  # unscored positions get no gradient


@pytest.mark.parametrize("name", LOSSES)
def test_unscored_positions_do_not_matter(name):
    s, t = pair()
    loss, _ = LOSSES[name]
    s2, t2 = s.clone(), t.clone()
    s2[~MASK], t2[~MASK] = 99.0, -99.0
    assert loss(s, t, MASK).item() == loss(s2, t2, MASK).item()


@pytest.mark.parametrize("name", [n for n in LOSSES if n != "sequence_kd"])
def test_teacher_gets_no_gradient(name):
    s, t = pair()
    t.requires_grad_()
    assert not LOSSES[name][0](s, t, MASK).requires_grad


@pytest.mark.parametrize("name", LOSSES)
def test_fp32_agrees_with_fp64(name):
    s, t = pair()
    loss, _ = LOSSES[name]
    hi = loss(s, t, MASK).item()
    lo = loss(s.float(), t.float(), MASK).item()
    # fp32 log-softmax and a 13-term sum: a few dozen units of 2^-24 relative, far below 1e-5
    assert abs(lo - hi) <= 1e-5 * max(1.0, abs(hi))


# ------------------------------------------------------------------------------ values


def test_forward_kl_is_the_quality_metrics_kl_times_t_squared():
    s, t = pair()
    for temp in (0.5, 1.0, 4.0):
        want = kl((t / temp).log_softmax(-1), (s / temp).log_softmax(-1))[MASK].mean() * temp**2
        assert L.forward_kl_loss(s, t, MASK, temperature=temp).item() == pytest.approx(
            want.item(), rel=1e-14
        )


def test_hinton_gradient_is_the_soft_target_cross_entropy_gradient():
    """Eq. (2): dC/dz = (1/T)(q - p) for C = -sum p log q at temperature T; the T^2 loss has
    T times that, for each of the N scored positions of the mean."""
    s, t = pair()
    temp = 2.5
    s.requires_grad_()
    (grad,) = torch.autograd.grad(L.forward_kl_loss(s, t, temperature=temp), s)
    q, p = (s.detach() / temp).softmax(-1), (t / temp).softmax(-1)
    assert torch.allclose(grad, temp**2 * (q - p) / temp / len(s), atol=1e-15)


def test_hinton_high_temperature_limit_is_matching_logits():
    """Eq. (4): zero-mean logits, T >> |z|: the T^2-scaled gradient -> (z - v) / N, the error
    shrinking as 1/T (the next term of the expansion)."""
    s, t = pair(n=1, v=10, scale=1.0)
    z, v = s - s.mean(), t - t.mean()
    errs = []
    for temp in (10.0, 100.0, 1000.0):
        zg = z.clone().requires_grad_()
        (grad,) = torch.autograd.grad(L.forward_kl_loss(zg, v, temperature=temp), zg)
        errs.append(((grad - (z - v) / 10).norm() / ((z - v) / 10).norm()).item())
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-2
    assert errs[0] / errs[1] == pytest.approx(10, rel=0.05)


def test_jsd_end_points_and_half():
    s, t = pair()
    fkl = L.forward_kl_loss(s, t, MASK)
    rkl = L.reverse_kl_loss(s, t, MASK)
    assert L.jsd_loss(s, t, MASK, beta=0.0).item() == fkl.item()
    assert L.jsd_loss(s, t, MASK, beta=1.0).item() == rkl.item()
    half = js(t.log_softmax(-1), s.log_softmax(-1))[MASK].mean()
    assert L.jsd_loss(s, t, MASK, beta=0.5).item() == pytest.approx(half.item(), rel=1e-13)
    assert L.jsd_loss(s, t, MASK, beta=0.5).item() <= math.log(2)


def test_jsd_divided_by_beta_tends_to_forward_kl():
    """Huszar's limit, quoted by GKD: JSD(beta) / beta -> KL(P || Q) as beta -> 0 (and by
    symmetry JSD(beta) / (1 - beta) -> KL(Q || P) as beta -> 1); the error is O(beta)."""
    s, t = pair(scale=1.0)
    fkl, rkl = L.forward_kl_loss(s, t).item(), L.reverse_kl_loss(s, t).item()
    for b in (1e-3, 1e-5):
        assert L.jsd_loss(s, t, beta=b).item() / b == pytest.approx(fkl, rel=20 * b)
        assert L.jsd_loss(s, t, beta=1 - b).item() / b == pytest.approx(rkl, rel=20 * b)


def test_jsd_matches_trl_formula():
    """TRL's GKDTrainer.generalized_jsd_loss, written again with probabilities: the mixture
    m = beta teacher + (1 - beta) student; beta KL(teacher || m) + (1 - beta) KL(student || m)."""
    s, t = pair()
    for beta in (0.1, 0.5, 0.9):
        p, q = t.softmax(-1), s.softmax(-1)
        m = beta * p + (1 - beta) * q
        want = beta * (p * (p / m).log()).sum(-1) + (1 - beta) * (q * (q / m).log()).sum(-1)
        got = L.jsd_loss(s, t, MASK, beta=beta).item()
        assert got == pytest.approx(want[MASK].mean().item(), rel=1e-13)


def test_skew_kl_matches_distillm_code():
    """jongwooko/distillm, distillm/losses.py: skewed_forward_kl is -sum p log(lam p + (1-lam) q),
    the cross-entropy form (our KL adds sum p log p, a constant of the teacher);
    skewed_reverse_kl is sum q (log q - log((1-lam) p + lam q))."""
    s, t = pair()
    lam = 0.1
    p, q = t.softmax(-1), s.softmax(-1)
    ce = -(p * (lam * p + (1 - lam) * q).log()).sum(-1)
    entropy = -(p * p.log()).sum(-1)
    fwd = L.skew_kl_loss(s, t, MASK, alpha=lam).item()
    assert fwd == pytest.approx((ce - entropy)[MASK].mean().item(), rel=1e-13)
    rev = (q * (q.log() - ((1 - lam) * p + lam * q).log())).sum(-1)
    got = L.skew_kl_loss(s, t, MASK, alpha=lam, reverse=True).item()
    assert got == pytest.approx(rev[MASK].mean().item(), rel=1e-13)


def test_skew_at_zero_is_plain_kl_and_skew_bounds_the_ratio():
    s, t = pair()
    assert L.skew_kl_loss(s, t, alpha=0.0).item() == L.forward_kl_loss(s, t).item()
    assert L.skew_kl_loss(s, t, alpha=0.0, reverse=True).item() == L.reverse_kl_loss(s, t).item()
    # a student that gives a teacher token ~0 probability: the forward KL explodes, the skew KL
    # stays below log(1 / alpha) per position (p / m <= 1 / alpha)
    s2 = s.clone()
    s2[:, 0], t2 = -200.0, t.clone()
    t2[:, 0] = 10.0
    assert L.forward_kl_loss(s2, t2).item() > 100
    assert L.skew_kl_loss(s2, t2, alpha=0.1).item() <= math.log(10)


def test_topk_with_the_whole_vocabulary_is_the_forward_kl():
    s, t = pair()
    values, idx = L.teacher_topk(t, t.shape[-1], F64)
    got = L.topk_kl_loss(s, values, idx, MASK, temperature=1.5).item()
    assert got == pytest.approx(L.forward_kl_loss(s, t, MASK, temperature=1.5).item(), rel=1e-13)


def test_topk_store_is_bf16_values_and_int32_ids_and_renormalization_needs_no_normalizer():
    s, t = pair()
    values, idx = L.teacher_topk(t, 4)
    assert values.dtype == torch.bfloat16 and idx.dtype == torch.int32
    assert (idx.long() == t.topk(4, dim=-1).indices).all()
    shifted = L.topk_kl_loss(s, values.double() + 7.0, idx)  # any per-row constant cancels
    assert shifted.item() == pytest.approx(L.topk_kl_loss(s, values.double(), idx).item(), 1e-13)


def test_captured_topk_loss_is_topk_kl_loss_bit_for_bit():
    """The experiment's topk step (captured_topk_kl: no id check, which would read the GPU)
    computes exactly losses.py's topk_kl_loss, value and gradient, in fp32 from bf16 values."""
    s, t = pair()
    for k, temp in ((4, 1.0), (13, 1.5)):
        values, idx = L.teacher_topk(t.float(), k)  # bf16 values, int32 ids: the stored form
        x, y = s.float().requires_grad_(), s.float().requires_grad_()
        want = L.topk_kl_loss(x, values, idx, temperature=temp)
        got = captured_topk_kl(y, values, idx, temp)
        assert torch.equal(got, want)
        assert torch.equal(torch.autograd.grad(got, y)[0], torch.autograd.grad(want, x)[0])


def test_topk_loss_of_the_teacher_itself_is_minus_log_one_minus_tail():
    _, t = pair()
    for k in (1, 3, 8):
        values, idx = L.teacher_topk(t, k, F64)
        tail = 1 - t.softmax(-1).gather(-1, idx.long()).sum(-1)
        got = L.topk_kl_loss(t, values, idx).item()
        assert got == pytest.approx(-(1 - tail).log().mean().item(), rel=1e-12)


def test_sequence_kd_is_cross_entropy_on_the_teacher_tokens():
    s, _ = pair()
    want = F.cross_entropy(s[MASK], TARGETS[MASK])
    assert L.sequence_kd_loss(s, TARGETS, MASK).item() == pytest.approx(want.item(), rel=1e-14)


# ------------------------------------------------------------------------------ bad input


def test_bad_inputs_get_clear_errors():
    s, t = pair()
    with pytest.raises(L.DistillInputError, match="differ in shape"):
        L.forward_kl_loss(s, t[:, :5])
    with pytest.raises(L.DistillInputError, match=r"\[positions, vocab\]"):
        L.reverse_kl_loss(s[0], t[0])
    with pytest.raises(L.DistillInputError, match="bool tensor of shape"):
        L.jsd_loss(s, t, MASK.long())
    with pytest.raises(L.DistillInputError, match="bool tensor of shape"):
        L.jsd_loss(s, t, MASK[:3])
    with pytest.raises(L.DistillInputError, match="scores no position"):
        L.jsd_loss(s, t, torch.zeros(6, dtype=torch.bool))
    with pytest.raises(L.DistillInputError, match="temperature must be > 0"):
        L.forward_kl_loss(s, t, temperature=0.0)
    with pytest.raises(L.DistillInputError, match=r"beta must be in \[0, 1\]"):
        L.jsd_loss(s, t, beta=1.5)
    with pytest.raises(L.DistillInputError, match=r"alpha must be in \[0, 1\)"):
        L.skew_kl_loss(s, t, alpha=1.0)
    with pytest.raises(L.DistillInputError, match=r"k must be in \[1, 13\]"):
        L.teacher_topk(t, 14)
    values, idx = L.teacher_topk(t, 3)
    with pytest.raises(L.DistillInputError, match="must both be"):
        L.topk_kl_loss(s, values[:, :2], idx)
    with pytest.raises(L.DistillInputError, match=r"ids in \[0, 13\)"):
        L.topk_kl_loss(s, values, idx + 13)
    with pytest.raises(L.DistillInputError, match="integer token ids"):
        L.topk_kl_loss(s, values, idx.float())
    with pytest.raises(L.DistillInputError, match="unknown method"):
        L.closed_form_grad("forward-kl", s, t)


# ------------------------------------------------------------------------------ on-policy


def tiny_dense(seed=0, vocab=50):
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, tie_word_embeddings=True)  # fmt: skip
    model = Qwen3ForCausalLM(cfg).double()
    init_weights(model, 0.2, seed)
    return model.eval()


def test_gumbel_sampling_draws_from_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]]).expand(40_000, 5)
    gen = torch.Generator().manual_seed(0)
    freq = torch.bincount(gumbel_sample(logits, gen), minlength=5).double() / 40_000
    p = logits[0].double().softmax(-1)
    # each frequency is a binomial mean: within 4 standard errors of p
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / 40_000).sqrt()).all()
    again = gumbel_sample(logits[:7], torch.Generator().manual_seed(1))
    assert (again == gumbel_sample(logits[:7], torch.Generator().manual_seed(1))).all()
    assert (gumbel_sample(logits[:7] * 1e3, gen) == 0).all()  # near-greedy at low temperature


def test_cached_sampling_uses_the_models_own_next_token_distribution():
    """Each token sampled through the KV-cache decode step is drawn from the logits a full
    forward pass gives at that position (fp64: the two agree to rounding)."""
    model = tiny_dense()
    prompt = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(0))
    step = eager_step(model, 3, 12)
    seen = []

    def recording(tokens, pos):
        out = step(tokens, pos)
        seen.append(out.clone())
        return out

    ids = sample_continuations(recording, prompt, 7, torch.Generator().manual_seed(0))
    assert ids.shape == (3, 12) and (ids[:, :5] == prompt).all()
    full = model(ids)
    for t, logits in enumerate(seen):
        assert torch.allclose(logits, full[:, t], atol=1e-10)


def test_sampling_needs_a_prompt_and_new_tokens():
    with pytest.raises(ValueError, match="need a prompt and new tokens"):
        sample_continuations(None, torch.zeros(2, 0, dtype=torch.long), 3, None)


def test_on_policy_loss_is_the_reverse_kl_at_the_written_positions():
    student, teacher = tiny_dense(0), tiny_dense(1)
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(1))
    ids = sample_continuations(eager_step(student, 2, 10), prompt, 6,
                               torch.Generator().manual_seed(2))  # fmt: skip
    at = written_positions(4, 6)
    assert (at.start, at.stop) == (3, 9)
    loss = on_policy_loss(student, teacher, ids, 4)
    want = L.reverse_kl_loss(student(ids)[:, at].flatten(0, 1), teacher(ids)[:, at].flatten(0, 1))
    assert loss.item() == pytest.approx(want.item(), rel=1e-13)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())  # the teacher only grades
    assert all(p.grad is not None for p in student.parameters())
    half = on_policy_loss(student, teacher, ids, 4, beta=0.5)
    assert half.item() < math.log(2)


def test_sequence_level_kd_on_greedy_teacher_output_with_an_moe_teacher():
    teacher = Qwen3MoeForCausalLM(TINY_MOE).double().eval()
    init_weights(teacher, 0.2, 3)
    prompt = torch.randint(0, 1000, (2, 3), generator=torch.Generator().manual_seed(3))
    ids = greedy_continue(teacher, prompt, 5)
    assert ids.shape == (2, 8) and (ids[:, :3] == prompt).all()
    for t in range(3, 8):  # each new token is the argmax after its prefix
        assert (ids[:, t] == teacher(ids[:, :t])[:, -1].argmax(-1)).all()
    student_logits = torch.randn(2 * 7, 1000, dtype=F64)
    loss = L.sequence_kd_loss(student_logits, ids[:, 1:].flatten())
    assert loss.item() == pytest.approx(
        F.cross_entropy(student_logits, ids[:, 1:].flatten()).item(), rel=1e-14
    )


# ------------------------------------------------------------------------------ account


def test_index_bytes_boundaries():
    assert [account.index_bytes(v) for v in (1, 256, 257, 65_536, 65_537, 151_936)] == [
        1, 1, 2, 2, 4, 4]  # fmt: skip
    assert math.ceil(math.log2(151_936)) == 18  # more than int16, so int32
    with pytest.raises(ValueError, match="at least one token"):
        account.index_bytes(0)


def test_bytes_per_token_at_qwen3_vocabulary():
    b = account.bytes_per_token(151_936, 64, 2, 4)
    assert b == {"full": 303_872, "topk": 384, "ratio": 303_872 / 384}
    with pytest.raises(ValueError, match="k must be in"):
        account.bytes_per_token(100, 101, 2, 4)


def test_moe_counts_equal_the_shared_model_test_and_the_meta_model():
    c = account.moe_counts(QWEN3_30B_A3B)
    assert c["total"] == 30_532_122_624 and c["active"] == 3_353_032_704
    assert c["n_matmul"] == c["active"] - 151_936 * 2048  # untied: the lookup is left out


def test_deepseek_v3_counts_by_a_second_route():
    """The same count by summing the per-layer blocks another way: the routed experts as one
    block of 58 x 256 experts, and attention per layer from the config's head dimensions."""
    c = account.DEEPSEEK_V3
    q = c["q_lora_rank"] * (c["dim"] + 1 + c["n_heads"] * 192)
    kv = c["dim"] * 576 + c["kv_lora_rank"] * (1 + c["n_heads"] * 256)
    attn = q + kv + c["n_heads"] * 128 * c["dim"] + 2 * c["dim"]
    total = (61 * attn + 3 * 3 * c["dim"] * c["inter_dim"] + 58 * (257 * 3 * c["dim"] * 2048
             + 256 * (c["dim"] + 1)) + c["dim"] + 2 * c["vocab_size"] * c["dim"])  # fmt: skip
    counted = account.deepseek_v3_counts(c)
    assert counted["total"] == total
    assert counted["total"] - counted["active"] == 58 * 248 * 3 * c["dim"] * 2048
    assert round(counted["total"] / 1e9) == 671 and round(counted["n_matmul"] / 1e9) == 37


def test_experts_touched_against_simulation():
    gen = torch.Generator().manual_seed(0)
    for e, k, b in ((128, 8, 1), (128, 8, 16), (16, 4, 3)):
        trials = 4000
        picks = torch.rand(trials, b, e, generator=gen).argsort(-1)[..., :k]  # k distinct each
        hit = torch.zeros(trials, e, dtype=torch.bool)
        hit.scatter_(1, picks.flatten(1), True)
        n = hit.sum(-1).double()
        want = account.experts_touched(e, k, b)
        assert abs(n.mean().item() - want) <= 4 * n.std().item() / trials**0.5 + 1e-12
    assert account.experts_touched(128, 8, 0) == 0 and account.experts_touched(128, 8, 1) == 8
    with pytest.raises(ValueError):
        account.experts_touched(8, 9, 1)


def test_moe_step_reads_n_at_batch_one_and_everything_at_large_batch():
    c = account.moe_counts(QWEN3_30B_A3B)
    assert account.moe_step_params(QWEN3_30B_A3B, 1) == pytest.approx(c["n_matmul"], rel=1e-12)
    everything = c["total"] - 151_936 * 2048  # all experts, no embedding lookup
    assert account.moe_step_params(QWEN3_30B_A3B, 10_000) == pytest.approx(everything, rel=1e-9)
    with pytest.raises(ValueError, match="at least one token"):
        account.moe_step_params(QWEN3_30B_A3B, 0)


def test_distill_flops_and_gpus_to_hold():
    f = account.distill_flops_per_token(3e9, 1e9)
    assert f == {"teacher_forward": 6e9, "student_train": 6e9, "teacher_share": 0.5}
    assert account.gpus_to_hold(671e9, 1, 141) == 5 and account.gpus_to_hold(141e9, 1, 141) == 1


# ------------------------------------------------------------------------------ experiment


def test_the_student_is_the_draft_model():
    """Dense, of the MoE's active size: in data/trained_models.yaml that is the draft model's
    shape (its MLP 1536 = 4 experts x 384), on the GPU and for the CPU stand-ins alike."""
    spec = load_trained_models()
    vocab = spec.tokenizer.vocab_size
    moe = model_config("moe", spec.models["moe"].config, vocab)
    draft = model_config("dense", spec.models["draft"].config, vocab)
    assert student_config(moe) == draft
    moe_n = account.moe_counts(moe)["n_matmul"]
    router = moe.num_hidden_layers * moe.num_experts * moe.hidden_size
    dense = sum(p.numel() for p in Qwen3ForCausalLM(draft).parameters())
    assert moe_n - router == dense  # tied head: the embedding is multiplied by every token


def test_student_loop_with_the_ce_loss_is_the_shared_trainer():
    """The experiment's loop with the next-token loss trains bit for bit what
    snippets/common/train.py's `train` trains: only the loss is swapped in the others."""
    spec = load_trained_models()
    from snippets.common.corpus import token_streams
    from snippets.common.train import rows

    train_stream, heldout_stream = token_streams(spec)
    cfg = student_config(TINY_MOE)
    cfg = Qwen3Config(**{**vars(cfg), "vocab_size": spec.tokenizer.vocab_size})
    tc = TrainConfig(steps=3, batch_size=2, seq_len=32, warmup_steps=1, eval_tokens=64)
    reference = Qwen3ForCausalLM(cfg)
    init_weights(reference, tc.init_std, tc.seed)
    train(reference, train_stream, heldout_stream, tc)
    st = Student(cfg, rows(train_stream, tc.seq_len), tc)
    st.use(loss_fns(st.model, None, CPU_BUDGET)["ce"])
    for i in range(tc.steps):
        st.step(i)
    for (name, a), b in zip(reference.state_dict().items(), st.model.state_dict().values(),
                            strict=True):  # fmt: skip
        assert torch.equal(a, b), name


def test_measure_of_the_teacher_against_itself():
    model = tiny_dense(0)
    held = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(4))
    prompts = held[:, :4]
    budget = Budget(steps=2, warmup_steps=0, topk=4, onpolicy_steps=1, prompt_len=4,
                    gen_len=4, seeds=1, eval_prompts=3)  # fmt: skip
    got = measure(model, model, held, prompts, budget, batch_size=2)
    assert got["kl_teacher"] == 0 and got["top1"] == 1 and abs(got["rkl_samples"]) < 1e-12


def test_measure_with_the_shared_teacher_pass_and_sampler():
    """run_experiment computes the teacher's log-probs once and samples every student through
    one decoder: each student measures as it does alone, in any order (the sampler follows the
    weights copied into it, not the first student's)."""
    teacher, a, b = tiny_dense(0), tiny_dense(1), tiny_dense(2)
    held = torch.randint(0, 50, (5, 16), generator=torch.Generator().manual_seed(4))
    prompts = torch.randint(0, 50, (3, 4), generator=torch.Generator().manual_seed(5))
    budget = Budget(steps=2, warmup_steps=0, topk=4, onpolicy_steps=1, prompt_len=4,
                    gen_len=4, seeds=1, eval_prompts=3)  # fmt: skip
    alone = {m: measure(m, teacher, held, prompts, budget, 2, seed=7) for m in (a, b)}
    logp = teacher_logprobs(teacher, held, 2)
    sampler = Sampler(a.config, len(prompts), 8, held.device, torch.float64)
    for m in (b, a):
        assert measure(m, teacher, held, prompts, budget, 2, 7, logp, sampler) == alone[m]
    assert alone[a] != alone[b]
    # at a low temperature the samples follow the weights: the sampler's are each student's own
    drawn = {}
    for m in (b, a):
        own = sample_continuations(
            eager_step(m, 3, 8), prompts, 4, torch.Generator().manual_seed(3), 0.1
        )
        drawn[m] = sampler(m, prompts, 4, torch.Generator().manual_seed(3), 0.1)
        assert torch.equal(drawn[m], own)
    assert not torch.equal(drawn[a], drawn[b])
    # the tail from the shared fp32 log-probs against softmax of the same fp32 logits: exp of
    # a log_softmax and a softmax differ by a few fp32 ulps (1.2e-7) per probability
    probs = teacher(held)[:, :-1].float().softmax(-1)
    want = (1 - probs.topk(4, dim=-1).values.sum(-1)).double().mean().item()
    assert teacher_tail(logp, 4) == pytest.approx(want, abs=1e-6)


def test_median_over_seeds():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0]) == 1.5


@pytest.mark.skipif(ON_GPU, reason="on CUDA, bench_gpu.py runs the experiment at full size")
def test_experiment_runs_end_to_end_on_the_cpu_stand_ins():
    from snippets.common.train import trained

    teacher = trained("moe")  # the CPU stand-in, trained in seconds
    out = run_experiment(teacher.model, teacher.train, CPU_BUDGET)
    assert set(out) == {"teacher", "runs", "methods"}  # every value is shown on the page
    assert [r["method"] for r in out["runs"]] == list(METHODS) * CPU_BUDGET.seeds
    assert [m["method"] for m in out["methods"]] == list(METHODS)
    for r in out["runs"]:
        assert math.isfinite(r["heldout_loss"]) and r["kl_teacher"] >= 0
        assert 0 <= r["top1"] <= 1 and r["rkl_samples"] >= -1e-6
    by = {(r["method"], r["seed"]): r for r in out["runs"]}
    for seed in range(CPU_BUDGET.seeds):  # distillation pulls the student towards the teacher
        assert by["fkl", seed]["kl_teacher"] < by["ce", seed]["kl_teacher"]
    assert 0 < out["teacher"]["tail_mass"] < 1
    with pytest.raises(ValueError, match="must divide seq_len"):
        run_experiment(teacher.model, teacher.train,
                       Budget(**{**vars(CPU_BUDGET), "prompt_len": 7}))  # fmt: skip

"""`attnv41 check` on golden copies altered in a tmp dir (the shared files are never
touched): a run that proves nothing fails, an `out` off by 1.5x the tolerance fails and
0.9x passes, tie-flagged rows without golden scores are judged by ours, and with
`--decode split` captured layers are held to what they leave observable."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnv41 import golden as golden_mod
from attnv41.cli import main
from attnv41.golden import GoldenFile, replay, runtime_split_impl
from helpers import golden_path

README_REL, README_ABS = 2.0**-7, 1e-4


def _copy(tmp_path, name: str, edit) -> str:
    """A copy of golden file `name` with `edit(tensors)` applied, same metadata."""
    with safe_open(str(golden_path(name)), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors)
    p = tmp_path / f"{name}_edited.safetensors"
    save_file(tensors, str(p), metadata=meta)
    return str(p)


def _drop(pred):
    def edit(t):
        for k in [k for k in t if pred(k)]:
            del t[k]

    return edit


# ---------------------------------------------------------------- item 8: runs that prove nothing


def test_nothing_compared_fails(tmp_path, capsys):
    """Every per-layer tensor but the inputs removed: 0 tensors compared is a failure."""
    p = _copy(tmp_path, "tiny", _drop(lambda k: k.count("/") == 3 and not k.endswith("/x")))
    assert main(["check", "--golden", p, "--variant", "released"]) == 1
    out = capsys.readouterr().out
    assert "no tensor was compared" in out
    assert out.rstrip().splitlines()[-1].startswith("FAIL") and "0 tensors compared" in out


@pytest.mark.parametrize("kind", ["index_k", "index_score", "candidates", "out"])
def test_every_tensor_of_a_kind_skipped_fails(tmp_path, capsys, kind):
    p = _copy(tmp_path, "tiny", _drop(lambda k: k.startswith(("released/", "intended/")) and k.endswith("/" + kind)))
    assert main(["check", "--golden", p, "--variant", "released"]) == 1
    out = capsys.readouterr().out
    assert f"every {kind} was skipped" in out, out[-2000:]
    assert out.rstrip().splitlines()[-1].startswith("FAIL")


# ---------------------------------------------------------------- item 16: the CLI holds the tolerance


@pytest.mark.parametrize("factor, rc", [(1.5, 1), (0.9, 0)], ids=["1.5x_fails", "0.9x_passes"])
def test_out_off_by_a_factor_of_the_tolerance(tmp_path, capsys, factor, rc):
    key = "released/decode15/L4/out"
    seen = {}

    def edit(t):
        ref = t[key]
        tol = ref.double().abs().max().item() * README_REL + README_ABS
        j = int(ref.double().abs().argmin())  # a small element: bf16 keeps the planted error nearly exact
        flat = ref.clone().view(-1)
        flat[j] = flat[j].double() + factor * tol
        seen["ratio"] = (flat[j].double() - ref.view(-1)[j].double()).abs().item() / tol
        t[key] = flat.view_as(ref)

    p = _copy(tmp_path, "tiny", edit)
    assert abs(seen["ratio"] - factor) < 0.05 * factor, seen  # the planted error, after bf16 rounding
    assert main(["check", "--golden", p, "--variant", "released"]) == rc
    out = capsys.readouterr().out
    assert ("FAIL decode15 L4: out" in out) is (rc == 1)
    assert out.rstrip().splitlines()[-1].startswith("FAIL" if rc else "PASS")


# ---------------------------------------------------------------- item 9a: sel_tie without index_score


def test_ties_without_golden_scores_are_judged_by_ours(tmp_path, capsys):
    """headdim's prefill has tie-flagged rows where the released top-k broke ties otherwise
    than ours. Without the file's index_score for L1 there, those rows are judged against
    our own scores, and the report says so."""
    p = _copy(tmp_path, "headdim", _drop(lambda k: k == "released/prefill/L1/index_score"))
    assert main(["check", "--golden", p, "--variant", "released", "--impl", "runtime"]) == 0
    out = capsys.readouterr().out
    assert "judged against our own scores (the file holds no index_score)" in out
    assert "prefill L1 sel: ok" in out and "prefill L2 sel: ok" in out


# ---------------------------------------------------------------- item 9b: --decode split


def _tie_at_decode15(t):
    """tiny decode15, L1 row 0: the golden 6th and 7th scores (positions 0 and 2) are 0.6
    tolerances apart. Make them an exact tie within the tolerance, flag the row, let the
    golden selection of L1 and L2 keep position 2 instead of 0 (the other valid top-k), and
    move `o`/`out` far, as a golden run attending to other rows would have."""
    W = 8
    sc = t["released/decode15/L1/index_score"].clone()
    assert sc[0, 2] < sc[0, 0]
    sc[0, 2] = sc[0, 0]
    t["released/decode15/L1/index_score"] = sc
    for i in (1, 2):
        sel = t[f"released/decode15/L{i}/sel"].clone()
        comp = sel[0, W:].tolist()
        assert W + 0 in comp and W + 2 not in comp, comp
        comp = sorted(W + 2 if v == W + 0 else v for v in comp)
        sel[0, W:] = torch.tensor(comp, dtype=sel.dtype)
        t[f"released/decode15/L{i}/sel"] = sel
        t[f"released/decode15/L{i}/sel_tie"] = torch.ones(1, dtype=torch.uint8)
        for n in ("o", "out"):
            t[f"released/decode15/L{i}/{n}"] = (t[f"released/decode15/L{i}/{n}"].float() * 1.5 + 0.5).bfloat16()


@pytest.mark.parametrize("decode", ["forward", "split"])
def test_reuse_layer_inherits_the_tie_exemption(tmp_path, capsys, decode):
    p = _copy(tmp_path, "tiny", _tie_at_decode15)
    args = ["check", "--golden", p, "--variant", "released", "--impl", "runtime", "--decode", decode]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "decode15 L2 sel: ok" in out and "decode15 L2 out: ok" in out and "1 excused" in out


def test_split_compares_the_captured_selection(tmp_path, capsys):
    """A golden selection of a captured (reuse) layer changed on an unflagged row: the
    split replay reads the selection the captured step used and fails."""

    def edit(t):
        sel = t["released/decode15/L4/sel"].clone()
        sel[0, -1] = -1
        t["released/decode15/L4/sel"] = sel

    p = _copy(tmp_path, "tiny", edit)
    assert main(["check", "--golden", p, "--variant", "released", "--impl", "runtime", "--decode", "split"]) == 1
    assert "FAIL decode15 L4: sel" in capsys.readouterr().out


def _corrupting_split(last: int, layer: int, what: str):
    """The split runtime whose captured `layer` corrupts, after its own attention at the
    step at `last`, its kv source's cache row 0 or the published candidate mask."""

    def make(cfg, w, ik, dev):
        impl = runtime_split_impl(cfg, w, ik, dev)
        stack = impl.stack
        body = stack.attn._decode_kernels  # what the graph driver runs for a captured layer

        def corrupting_body(wl, st, x, rows_b, *args, **kw):
            out = body(wl, st, x, rows_b, *args, **kw)
            if wl.role.layer == layer and st.next_pos == last:  # the driver advances next_pos after the step
                if what == "candidates":
                    stack.attn.plan.cand[0] = ~stack.attn.plan.cand[0]
                else:
                    getattr(stack.states[layer - 1], what)[0].mul_(-1)
            return out

        stack.attn._decode_kernels = corrupting_body
        return impl

    return make


@pytest.mark.parametrize("what", ["index_k", "compress_kv"])
def test_split_sees_caches_a_captured_step_corrupts(what):
    """L2 overwrites a row of L1's cache after attending, at the last step: nothing later
    reads it, only what the step left observable shows it (the whole step is one graph,
    so it is observed after the step: at L2 and at L1, whose cache it is)."""
    g = GoldenFile(golden_path("tiny"))
    last = g.regimes[-1]["start_pos"]
    rep = replay(g, "released", _corrupting_split(last, 2, what), impl_name="runtime-split-corrupting")
    fails = rep.failures()
    assert sorted(f.split(":")[0] for f in fails) == [f"decode{last} L1", f"decode{last} L2"], fails
    assert all(f.split(": ")[1] == what for f in fails), fails


def test_split_sees_candidates_a_captured_step_corrupts():
    g = GoldenFile(golden_path("tiny"))
    last = g.regimes[-1]["start_pos"]
    rep = replay(g, "released", _corrupting_split(last, 4, "candidates"), impl_name="runtime-split-corrupting")
    assert any(f.startswith(f"decode{last} L4: candidates: FAIL") for f in rep.failures()), rep.failures()


def test_captured_selection_tail_must_be_padding():
    """Early in a sequence the visible top-k is narrower than the buffer: the captured
    selection is trimmed to it, and anything but −1 past it is reported."""
    from attnv41.golden import _Captured
    from helpers import random_inputs, random_weights, small_cfg

    cfg = small_cfg()
    w = random_weights(cfg, 5)
    impl = runtime_split_impl(cfg, w, "own", "cpu")
    xs = random_inputs(cfg, 4, 6)
    for i in range(cfg.n_layers):
        impl.layer(i, xs[i][:3], 0)
    traces = impl.decode_step([x[3:4] for x in xs], 3)  # L = 2 compressed rows < index_topk 6
    k = 2
    assert tuple(traces[2].sel.shape) == (1, cfg.window + k) and not traces[2].errors
    impl.stack.attn.plan.sel_for(2)[0, -1] = 0
    cap = _Captured.of(cfg, impl.stack, 2, 3, 1)
    assert cap.sel is None and "allowed: all −1" in cap.errors["sel"]


def test_split_layers_report_observables():
    """The split replay of the tiny file compares, for captured layers, sel and the source
    rows they read; only q and o are skipped."""
    g = GoldenFile(golden_path("tiny"))
    rep = replay(g, "released", golden_mod.runtime_split_impl, impl_name="runtime-split")
    assert rep.ok, "\n".join(rep.failures())
    for lr in rep.layers:
        if lr.regime != "prefill" and lr.layer in (2, 4):
            names = {c.name for c in lr.cmps}
            assert {"sel", "out", "kv_win", "compress_kv", "index_k"} <= names, (lr.regime, lr.layer, names)
            assert sorted(lr.skipped) == ["o", "q"]
    assert not rep.problems()


# ---------------------------------------------------------------- item 11: the non-finite counter in the report


def test_runtime_check_reports_the_nonfinite_counter(tmp_path, capsys):
    assert main(["check", "--impl", "runtime", "--variant", "released"]) == 0
    assert "tiny/released: 0 non-finite values entered a cache write" in capsys.readouterr().out

    def poison(t):
        t["released/decode15/L0/x"][0, 3] = float("nan")

    p = _copy(tmp_path, "tiny", poison)
    assert main(["check", "--golden", p, "--impl", "runtime", "--variant", "released"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: 32 non-finite values entered a cache write" in out, out[-1500:]

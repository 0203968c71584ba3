"""Make the documentation's pictures and generated tables from the labeled suites.

Run from the repository root (needs the ``[plot]`` extra)::

    python docs/make_figures.py            # pictures + bench tables (about a minute)
    python docs/make_figures.py --no-bench # pictures and the kinds table only

It writes

* ``docs/img/failing-run.png``: the README's picture, ``trainsignals plot`` of one real run;
* ``docs/img/kinds/<kind>.png``: one run per failure kind, drawn by ``trainsignals plot``:
  a run of ``datasets/real`` when that suite has the kind, else of ``datasets/synthetic``;
* ``docs/generated/kinds.md`` and ``docs/generated/advice-<kind>.md``: the event kinds with
  their likely cause and first fix, as the code states them;
* ``docs/generated/bench-synthetic.md``, ``docs/generated/bench-real.md``: the output of
  ``trainsignals bench --markdown`` on each committed suite;
* ``docs/generated/headline.md``: the short detection table of the README, from the same runs,
  also written into ``README.md`` between its ``bench:start`` / ``bench:end`` markers.

Each picture is a run picked by a rule, not by hand: of the suite's runs of that kind, the one
whose replay by the default Monitor raises that kind after the onset, with no alarm before it
and the fewest alarms in all (the first in the suite's order on a tie). Every run is written to
a trace with ``trainsignals.io.traces.write_trace`` and drawn by the ``trainsignals plot`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
GENERATED = ROOT / "docs" / "generated"
HERO_KIND = "loss_spike"  # the README's picture: a real run of this kind (picked by the rule above)
HERO_RUN = "loss_spike-cnn-5"  # preferred when it still shows its kind: a bad batch, then divergence
ALARMS = ("warning", "critical")


def _alarms(curve):
    import trainsignals as ts

    events = ts.Monitor(total_steps=curve.total_steps).scan(**curve.signals())
    return [e for e in events if e.severity in ALARMS]


def _shows_its_kind(curve, alarms) -> bool:
    if any(e.step < curve.onset_step for e in alarms):
        return False
    return any(str(e.kind) == curve.kind for e in alarms)


def pick(curves, kind: str):
    """The run of ``kind`` drawn for it (see the module docstring), or None."""
    best = None
    for c in curves:
        if c.kind != kind:
            continue
        alarms = _alarms(c)
        if _shows_its_kind(c, alarms) and (best is None or len(alarms) < best[0]):
            best = (len(alarms), c)
    return None if best is None else best[1]


def plot(curve, out: Path, dpi: int) -> None:
    """``trainsignals plot`` of ``curve`` into ``out``, shrunk to a palette PNG."""
    from PIL import Image

    from trainsignals.cli import main
    from trainsignals.io.traces import write_trace

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / f"{curve.name}.arrow"
        write_trace(trace, **curve.signals(), metadata={"run": curve.name, "kind": curve.kind,
                                                        "onset_step": curve.onset_step})
        raw = Path(tmp) / "raw.png"
        with contextlib.redirect_stdout(io.StringIO()):
            status = main(["plot", str(trace), "-o", str(raw), "--dpi", str(dpi)])
        if status != 0:
            raise RuntimeError(f"trainsignals plot failed on {curve.name}")
        Image.open(raw).convert("RGB").quantize(colors=64).save(out, optimize=True)
    print(f"{out.relative_to(ROOT)}: {curve.name} ({out.stat().st_size // 1024} kB)")


def figures() -> dict[str, str]:
    """Draw every picture; returns {kind: "suite/run"} for the runs drawn."""
    from trainsignals.curves import KINDS, load_suite

    real, synthetic = load_suite("real"), load_suite("synthetic")
    by_name = {c.name: c for c in real}
    hero = by_name.get(HERO_RUN)
    if hero is None or not _shows_its_kind(hero, _alarms(hero)):
        hero = pick(real, HERO_KIND)
    plot(hero, IMG / "failing-run.png", dpi=80)
    drawn = {}
    real_kinds = {c.kind for c in real}
    for kind in KINDS:
        suite, curves = ("real", real) if kind in real_kinds else ("synthetic", synthetic)
        curve = pick(curves, kind)
        if curve is None:
            print(f"no run of {suite} shows {kind}: no picture", file=sys.stderr)
            continue
        plot(curve, IMG / "kinds" / f"{kind}.png", dpi=60)
        drawn[kind] = f"{suite}/{curve.name}"
        (GENERATED / f"caption-{kind}.md").write_text(caption(curve, suite))
    return drawn


def caption(curve, suite: str) -> str:
    """What the picture of ``curve`` shows, in words: the run, its onset, the alarms raised."""
    alarms = _alarms(curve)
    said = ", ".join(f"`{e.kind}` ({e.severity}) at step {e.step}" for e in alarms[:5])
    more = f" and {len(alarms) - 5} more" if len(alarms) > 5 else ""
    return (f"*Run `{curve.name}` of `datasets/{suite}` ({curve.total_steps} steps, fault from step "
            f"{curve.onset_step}), drawn by `trainsignals plot`. The default Monitor raises {said}{more}.*\n")


def kinds_table(drawn: dict[str, str]) -> str:
    """The event kinds, their likely cause and first fix, from the code."""
    from trainsignals import DISTRIBUTED_KINDS, Kind
    from trainsignals.kinds import KINDS

    lines = ["| kind | likely cause | first fix | picture from |", "|---|---|---|---|"]
    for kind in Kind:
        cause, fix = KINDS[kind].cause, KINDS[kind].fix
        where = drawn.get(kind.value, "(data-parallel jobs only)" if kind in DISTRIBUTED_KINDS else "-")
        lines.append(f"| [`{kind.value}`](#{kind.value}) | {cause} | {fix} | {where} |")
    return "\n".join(lines) + "\n"


def advice_snippets() -> None:
    """``docs/generated/advice-<kind>.md``: the likely cause and first fix of each kind, from the code."""
    from trainsignals import Kind
    from trainsignals.kinds import KINDS

    for kind in Kind:
        cause, fix = KINDS[kind].cause, KINDS[kind].fix
        (GENERATED / f"advice-{kind.value}.md").write_text(
            f"**Likely cause:** {cause}.\n\n**First fix:** {fix}.\n")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def headline(results) -> str:
    """Right-kind detection per kind, ours against the best baseline: the held-out real suite
    first (no threshold was chosen on it), then the two suites the defaults were tuned on."""
    held, syn, real = results["heldout"], results["synthetic"], results["real"]
    kinds = [k for k in syn.kinds]
    head = ["| kind | **held-out real**: trainsignals | best baseline | tuned on, real | best baseline "
            "| tuned on, synthetic | best baseline |",
            "|---|---:|---:|---:|---:|---:|---:|"]

    def cells(result, kind):
        ours = result.scores[result.main].kinds.get(kind)
        if ours is None:
            return ["-", "-"]
        others = [(s.kinds[kind].rate or 0.0, name) for name, s in result.scores.items()
                  if name != result.main and kind in s.kinds]
        rate, name = max(others, default=(None, ""))
        n = f" (n={ours.n})" if result is held else ""
        return [_pct(ours.rate) + n, f"{_pct(rate)} ({name})" if name else "-"]

    rows = [f"| `{k}` | " + " | ".join(cells(held, k) + cells(real, k) + cells(syn, k)) + " |" for k in kinds]
    for label, attr in (("healthy runs with any alarm", "healthy_alarm_rate"),
                        ("faulty runs alarmed before onset", "pre_onset_rate")):
        vals = []
        for result in (held, real, syn):
            ours = getattr(result.scores[result.main], attr)
            vals += [f"**{100 * ours:.1f} %**" if result is held else f"{100 * ours:.1f} %", ""]
        rows.append(f"| {label} | " + " | ".join(vals) + " |")
    n = f"{held.n_curves} held-out real, {real.n_curves} real and {syn.n_curves} synthetic runs"
    note = (f"Right-kind detection within the window after onset, {n}. The held-out suite "
            "(`datasets/real_heldout/`: five model families the tuning suites lack) was built once (and rebuilt with its "
            "own command when its healthy label came to need an unchanged twin in every signal, and when "
            "the builder came to record a classifier's answers, every earlier value kept; rechecked when the "
            "label checks came to ask a faulty run to be healthy until its onset, which dropped 4 runs that "
            "had begun to overfit before their fault) and "
            "never used to choose a threshold; the other two are the suites the defaults were chosen on, "
            "so their figures show fit, not quality. Best baseline: the best of the baselines that "
            "`trainsignals bench` runs beside the Monitor, for that kind.")
    return "\n".join(head + rows) + "\n\n" + note + "\n"


def bench_tables() -> dict:
    from trainsignals.eval import bench

    results = {}
    for suite in ("heldout", "synthetic", "real"):
        result = bench.run_bench(suite=suite)
        results[suite] = result
        md = result.to_markdown()
        unmet = result.check_targets()
        md += "\n" + ("Targets: all met." if not unmet else "Targets unmet: " + "; ".join(unmet)) + "\n"
        md += ("\nAlarms on the healthy runs, by detector (`trainsignals bench --suite " + suite
               + " --rules`):\n\n" + bench.rules_markdown(bench.rule_rates(suite)))
        (GENERATED / f"bench-{suite}.md").write_text(
            f"<!-- made by docs/make_figures.py from `trainsignals bench --suite {suite} --markdown` -->\n\n" + md)
        print(f"docs/generated/bench-{suite}.md")
    return results


def update_readme(table: str) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = re.sub(r"(<!-- bench:start[^>]*-->\n).*?(<!-- bench:end -->)",
                 lambda m: m.group(1) + table + m.group(2), text, flags=re.S)
    if new != text:
        readme.write_text(new)
        print("README.md: headline table updated")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-bench", action="store_true", help="skip the bench tables")
    parser.add_argument("--no-figures", action="store_true", help="skip the pictures")
    args = parser.parse_args(argv)
    GENERATED.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, str] = {}
    advice_snippets()
    if not args.no_figures:
        drawn = figures()
        (GENERATED / "kinds.md").write_text(
            "<!-- made by docs/make_figures.py -->\n\n" + kinds_table(drawn))
    if not args.no_bench:
        table = headline(bench_tables())
        (GENERATED / "headline.md").write_text(table)
        update_readme(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bench's summary: medians and ratios, its markdown table and plots."""

import statistics
from pathlib import Path

import numpy as np


MiB = 1 << 20

# map_submit: wgpu-py 0.32's `map_async("READ")` first submits an empty command buffer (its
# workaround for wgpu-native#305), synchronously, on the calling (event loop) thread.
SPLIT_PARTS = ("prepare", "resize", "stage", "encode", "submit", "map_submit", "readback_wait", "read_outputs")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# --- report -----------------------------------------------------------------------------------
def summarize(raw):
    """Medians (and the raw runs) in one JSON-able dict."""
    w = raw["wgpu"]
    base = raw["baselines"]
    out = {"meta": raw["meta"], "models": raw["models"]}
    backends = {"wgpu": {"decode": w["decode"], "prefill": w["prefill"]}}
    for dev, r in base["eager"].items():
        backends[f"torch eager ({dev})"] = r
    backends["executorch xnnpack"] = base["xnnpack"]
    decode, prefill = {}, {}
    for name, r in backends.items():
        if r is None or "error" in r:
            decode[name] = None
            prefill[name] = {str(pp): None for pp in w["prompts"]}
            continue
        decode[name] = median(r["decode"])
        prefill[name] = {str(pp): median(r["prefill"][pp]) for pp in w["prompts"]}
    out["decode_tokens_per_s"] = decode
    out["prefill_tokens_per_s"] = prefill
    out["baseline_errors"] = {name: r["error"] for name, r in backends.items() if r and "error" in r}
    out["resize"] = {
        k: (None if v is None else v if "error" in v else dict(v, ms_per_execute=median(v["ms_per_execute"])))
        for k, v in w["resize"].items()
    }
    out["cpu_split_ms"] = w["split"]
    out["concurrency_tokens_per_s"] = {
        mode: {str(n): dict(r, tokens_per_s=median(r["tokens_per_s"])) for n, r in rows.items()}
        for mode, rows in w["concurrency"].items()
    }
    if "streaming" in w:
        out["streaming"] = w["streaming"]
    if "profile" in w:
        prof = dict(w["profile"])
        prof.pop("trace", None)
        out["profile"] = prof
    out["raw"] = {"wgpu": {k: w[k] for k in ("decode", "prefill", "concurrency")}, "baselines": base}
    return _jsonable(out)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return x


def _fmt(x, digits=1):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _ratio(a, b):
    return "n/a" if a is None or b is None or not b else f"{a / b:.2f}x"


def markdown(s):
    m = s["meta"]
    lines = [
        f"# pte-wgpu bench ({'short' if m['short'] else 'full'}, median of {m['runs']} run(s))",
        "",
        f"- device: {m['device']}",
        f"- model: {m['model']}",
        f"- host: {m['host']}; wgpu {m['wgpu']}, torch {m.get('torch', 'n/a')}, executorch {m.get('executorch', 'n/a')}",
        "",
    ]
    names = list(s["decode_tokens_per_s"])
    others = [n for n in names if n != "wgpu"]
    head = "| scenario | " + " | ".join(names) + " | " + " | ".join(f"wgpu / {n}" for n in others) + " |"
    lines += ["## Tokens/s (one session)", "", head, "|" + " --- |" * (1 + len(names) + len(others))]

    def row(label, vals):
        w = vals.get("wgpu")
        return f"| {label} | " + " | ".join(_fmt(vals[n]) for n in names) + " | " + " | ".join(_ratio(w, vals[n]) for n in others) + " |"

    lines.append(row(f"decode ({s['meta']['decode_tokens']} tokens)", s["decode_tokens_per_s"]))
    for pp in s["meta"]["prompts"]:
        lines.append(row(f"prefill {pp}", {n: s["prefill_tokens_per_s"][n][str(pp)] for n in names}))
    for name, err in s["baseline_errors"].items():
        lines.append(f"\n{name}: n/a ({err.splitlines()[0][:200]})")
    lines += ["", "## Resize overhead", "", "| variant | ms / execute | hook calls / execute | resize events / execute |", "| --- | --- | --- | --- |"]
    for k, v in s["resize"].items():
        if v is None or "error" in v:
            lines.append(f"| {k} | n/a | n/a | n/a |")
        else:
            lines.append(f"| {k} | {_fmt(v['ms_per_execute'], 3)} | {_fmt(v['hook_calls_per_execute'])} | {_fmt(v['resize_events_per_execute'], 2)} |")
    lines += [
        "",
        "## CPU time per execute (ms; readback wait is time awaiting the map, not CPU)",
        "",
        "| step | " + " | ".join(SPLIT_PARTS) + " | other | execute |",
        "|" + " --- |" * (len(SPLIT_PARTS) + 3),
    ]
    for label, r in s["cpu_split_ms"].items():
        lines.append(f"| {label} | " + " | ".join(_fmt(r[p], 3) for p in SPLIT_PARTS + ("other", "execute")) + " |")
    lines += ["", "## Concurrency: aggregate decode tokens/s", "", "| sessions | batched | unbatched | batched / unbatched | submits / execute (batched) |", "| --- | --- | --- | --- | --- |"]
    c = s["concurrency_tokens_per_s"]
    for n in c["batched"]:
        b, u = c["batched"][n], c["unbatched"][n]
        lines.append(f"| {n} | {_fmt(b['tokens_per_s'])} | {_fmt(u['tokens_per_s'])} | {_ratio(b['tokens_per_s'], u['tokens_per_s'])} | {_fmt(b['submits_per_execute'], 2)} |")
    prof = s.get("profile")
    if prof:
        lines += ["", "## GPU profile (timestamp queries, one compute pass per dispatch)", ""]
        if not prof["supported"]:
            lines.append(prof["note"])
        else:
            lines.append(f"Timestamps in {prof['units']}; profiled steps run one pass per dispatch, so use shares, not totals.")
            for phase, rows in prof["ops"].items():
                lines += [
                    "", f"### {phase}", "",
                    "| op | dispatches | total µs | mean µs | share | GB/s (bound tensors) |",
                    "| --- | --- | --- | --- | --- | --- |",
                ]
                for r in rows[:25]:
                    lines.append(
                        f"| {r['op']} | {r['count']} | {r['total_us']:.1f} | {r['mean_us']:.2f} | {100 * r['share']:.1f}% "
                        f"| {r['gb_per_s']:.1f} |"
                    )
    if s.get("streaming"):
        lines += streaming_lines(s["streaming"])
    return "\n".join(lines) + "\n"


def plots(s, out_dir, log):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("--plots: matplotlib is not installed (pip install matplotlib); no plots written")
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    c = s["concurrency_tokens_per_s"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, rows in c.items():
        ns = [int(n) for n in rows]
        ax.plot(ns, [rows[str(n)]["tokens_per_s"] for n in ns], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sessions")
    ax.set_ylabel("aggregate decode tokens/s")
    ax.set_title(s["meta"]["device"][:60], fontsize=8)
    ax.legend()
    fig.tight_layout()
    path = out_dir / "concurrency.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    prof = s.get("profile")
    if prof and prof.get("supported"):
        for phase, rows in prof["ops"].items():
            rows = rows[:20]
            if not rows:
                continue
            fig, ax = plt.subplots(figsize=(7, 0.3 * len(rows) + 1.2))
            ax.barh([r["op"] for r in rows][::-1], [r["total_us"] for r in rows][::-1])
            ax.set_xlabel(f"GPU µs ({phase}, one pass per dispatch)")
            fig.tight_layout()
            path = out_dir / f"ops_{phase}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written


def streaming_lines(s):
    """The markdown section of the streaming-kernel scenario (streaming.py)."""
    copy = "n/a" if s["copy_gb_per_s"] is None else f"{_fmt(s['copy_gb_per_s'], 2)} GB/s, from {s['copy_reference']}"
    lines = [
        "", "## Streaming kernels (GB/s, share of copy bandwidth)", "",
        f"Median of {s['runs']} run(s), each of R back-to-back dispatches (R: at least {s['reps']}, and enough to move "
        f"{s['span_bytes'] / 1e9:.3g} GB), timed by {s['timing']}: GB/s use the timestamps when the two agree within "
        f"{s['agree']:.0%}, else wall clock (\"timed by\"). Copy bandwidth (the better of the two copy rows): {copy}. "
        "Bytes moved: every bound tensor once. Kernels moving less than "
        f"{s['footprint'] / MiB:g} MiB a dispatch cycle through copies of their buffers (a weight is read from memory, "
        f"not from cache). Tensors are capped at {s['limit_bytes'] / MiB:,.0f} MiB (the adapter's binding limit); "
        "outputs are sampled (first, middle, last and scattered elements) and checked against numpy (max rel err).",
        "", "| kernel | shapes | bytes moved | R | µs / dispatch (timestamps) | µs / dispatch (wall) | timed by | GB/s "
        "| share of copy bandwidth | max rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in s["kernels"].items():
        if "error" in r:
            lines.append(f"| {label} | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | {r['error'][:160]} |")
            continue
        shapes = " ".join(str(x) for x in r["shapes"])
        share = "n/a" if r["share_of_copy"] is None else f"{100 * r['share_of_copy']:.1f}%"
        lines.append(
            f"| {label} | {shapes} | {r['bytes'] / MiB:,.1f} MiB | {r['dispatches_per_run']} | {_fmt(r['us_timestamps'])} "
            f"| {_fmt(r['us_wall'])} | {r['timed_by']} | {_fmt(r['gb_per_s'], 2)} | {share} | {r['max_rel_err']:.1e} |"
        )
    return lines

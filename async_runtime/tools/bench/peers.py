"""The peer runtimes as baselines in the same call: llama.cpp's Vulkan backend and ONNX Runtime's
WebGPU EP, run from their prebuilt kits (`../shared/peers/`, see `../shared/docs/peers.md`) on the
same SmolLM2-135M-shaped synthetic weights, and their figures read back into the rows bench_llm.py
reports for pte-wgpu:

    decode_1, prefill_512, prefill_2048, decode_16, decode_32, decode_64   (tokens/s)

    python examples/bench_llm.py model.pte --params p.json --peers PEERS_DIR [--peer-kits llamacpp,ort]
    python -m async_runtime.tools.bench.peers PEERS_DIR --out DIR [--kits llamacpp]   # the peers alone

Each kit's `run.sh` writes its raw output into `--out`; this module only runs it and parses it.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROWS = ("decode_1", "prefill_512", "prefill_2048", "decode_16", "decode_32", "decode_64")


def run_kit(peers_dir, kit, out_dir, env=None, timeout=590):
    """Run `peers_dir/kit/run.sh` with OUT=out_dir/kit; returns (seconds, return code)."""
    peers_dir, out = os.path.abspath(peers_dir), os.path.abspath(os.path.join(out_dir, kit))
    os.makedirs(out, exist_ok=True)
    t = time.perf_counter()
    with open(os.path.join(out, "bench_peers.log"), "w") as log:
        rc = subprocess.run(["bash", os.path.join(peers_dir, kit, "run.sh")], env=dict(os.environ, OUT=out, **(env or {})),
                            cwd=os.path.dirname(peers_dir), stdout=log, stderr=subprocess.STDOUT,
                            timeout=timeout).returncode
    return time.perf_counter() - t, rc


def llamacpp_rows(out):
    """{model: {row: tokens/s}} from llama-bench's JSON (flash attention on) and llama-batched-bench's JSONL."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "llamacpp_*.json"))):
        model = os.path.basename(path)[len("llamacpp_"):-len(".json")]
        try:
            runs = json.load(open(path))
        except (OSError, ValueError):
            continue
        r = rows.setdefault(model, {})
        for run in runs:
            if not run.get("flash_attn"):
                continue
            if run["n_gen"] == 0:
                r[f"prefill_{run['n_prompt']}"] = run["avg_ts"]
            elif run["n_prompt"] == 0:
                r["decode_1"] = run["avg_ts"]
    for path in sorted(glob.glob(os.path.join(out, "llamacpp_batched_*_faon.jsonl"))):
        model = os.path.basename(path)[len("llamacpp_batched_"):-len("_faon.jsonl")]
        for line in open(path):
            run = json.loads(line)
            if run["pl"] > 1:
                rows.setdefault(model, {})[f"decode_{run['pl']}"] = run["speed_tg"]
    return rows


def ort_rows(out):
    """{model tag/engine: {row: tokens/s}} from bench_ort.py's JSON files."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "ort_webgpu*.json"))):
        result = json.load(open(path))
        tag = os.path.basename(path)[len("ort_webgpu"):-len(".json")].strip("_") or "fp32"
        for engine, e in result.get("engines", {}).items():
            if "error" in e:
                continue
            r = rows.setdefault(f"{tag} ({engine})", {})
            if "decode_b1" in e:
                r["decode_1"] = e["decode_b1"].get("tok_s")
            for n, p in e.get("prefill", {}).items():
                r[f"prefill_{n}"] = p.get("tok_s")
            for key, b in e.items():
                if key.startswith("decode_b") and key != "decode_b1" and "agg_tok_s" in b:
                    r[f"decode_{key[len('decode_b'):]}"] = b["agg_tok_s"]
    return rows


PARSERS = {"llamacpp": llamacpp_rows, "ort": ort_rows}


def bench_peers(peers_dir, out_dir, kits=("llamacpp", "ort"), log=print):
    """Run each kit and return {kit: {"seconds", "rc", "rows": {model: {row: tokens/s}}}}."""
    results = {}
    for kit in kits:
        log(f"running the {kit} peer kit ...")
        seconds, rc = run_kit(peers_dir, kit, out_dir)
        results[kit] = {"seconds": seconds, "rc": rc, "rows": PARSERS[kit](os.path.join(out_dir, kit))}
        log(f"{kit}: rc={rc} in {seconds:.0f} s: {json.dumps(results[kit]['rows'])}")
    return results


def markdown(ours, peers):
    """One table: our row values (`ours`: {row: tokens/s}) beside each peer model's."""
    cols = [("pte-wgpu", ours)] + [(f"{kit} {model}", r) for kit, res in peers.items() for model, r in res["rows"].items()]
    lines = ["| tokens/s | " + " | ".join(c for c, _ in cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(_fmt(r.get(row)) for _, r in cols) + " |")
    return "\n".join(lines)


def _fmt(x):
    return "—" if x is None else f"{x:,.0f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("peers", help="the folder holding llamacpp/ and ort/")
    p.add_argument("--out", required=True)
    p.add_argument("--kits", default="llamacpp,ort")
    args = p.parse_args(argv)
    res = bench_peers(args.peers, args.out, args.kits.split(","), log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(res, indent=1))
    print(markdown({}, res))


if __name__ == "__main__":
    main()

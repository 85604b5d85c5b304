#!/usr/bin/env python3
"""`make quality`: voice quality under loss, PESQ narrowband, Tusa against a baseline.

Real speech (Debian's pocketsphinx-testdata) goes through `tusa voice simulate`
three ways on the same network traces (same model, same seed):
  codec alone  — every packet decoded in order (--playout ideal)
  baseline     — speexdsp's jitter buffer + the codec's plain concealment, FEC off
                 (a Mumble-style pipeline: --playout speex --no-fec)
  tusa         — Tusa's adaptive playout: FEC from the next packet, concealment
                 fading to comfort noise, time-stretch (--playout tusa)
and each output is scored with PESQ (ITU-T P.862 narrowband, PyPI `pesq`)
against the clean input at 8 kHz. Scores are means over utterances and seeds.

Usage: quality.py TUSA_BINARY OUT_DIR [--seeds N] [--codec opus|speex] [--quick]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import wave

import numpy as np
from pesq import pesq

CORPUS = "/usr/share/pocketsphinx/test/data"
UTTERANCES = [
    "librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0890.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0930.wav",
    "cards/005.wav",
]
# (label, loss %, mean burst length, jitter ms)
CONDITIONS = [
    ("clean", 0, 1, 0),
    ("5 % random", 5, 1, 0),
    ("10 % random", 10, 1, 0),
    ("20 % random", 20, 1, 0),
    ("10 % bursty (mean burst 3)", 10, 3, 0),
    ("20 % bursty (mean burst 3)", 20, 3, 0),
    ("10 % random + 30 ms jitter", 10, 1, 30),
]


def read_wav(path):
    with wave.open(path) as w:
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        if w.getnchannels() > 1:
            data = data.reshape(-1, w.getnchannels()).mean(axis=1).astype(np.int16)
    return rate, data


def simulate(tusa, src, out, *args):
    cmd = [tusa, "voice", "simulate", "--in", src, "--out", out, "--json", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"quality: {' '.join(cmd)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def score(ref_path, deg_path):
    rate, ref = read_wav(ref_path)
    _, deg = read_wav(deg_path)
    n = min(len(ref), len(deg))
    # PESQ aligns in time itself; the degraded file may be longer (initial playout delay).
    deg = deg[: len(ref) + rate]  # at most one extra second
    return pesq(rate, ref.astype(np.float64), deg.astype(np.float64), "nb") if n > rate // 4 else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tusa")
    ap.add_argument("out")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--codec", default="opus")
    ap.add_argument("--quick", action="store_true", help="two utterances, one seed (smoke run)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    utterances = UTTERANCES[:2] if a.quick else UTTERANCES
    seeds = range(1, 2 if a.quick else a.seeds + 1)
    conditions = CONDITIONS[:3] if a.quick else CONDITIONS

    # Clean references at 8 kHz: the input through the L16 "codec", no network.
    refs = {}
    for u in utterances:
        src = os.path.join(CORPUS, u)
        ref = os.path.join(a.out, os.path.basename(u).replace(".wav", ".ref8k.wav"))
        simulate(a.tusa, src, ref, "--codec", "l16", "--playout", "ideal")
        refs[u] = (src, ref)

    rows = []
    for label, loss, burst, jitter in conditions:
        scores = {"alone": [], "baseline": [], "fec": [], "tusa": []}
        delays = {"baseline": [], "fec": [], "tusa": []}
        late = {"baseline": [], "fec": [], "tusa": []}
        rates = {"baseline": [], "fec": [], "tusa": []}
        depths = []
        for u in utterances:
            src, ref = refs[u]
            base = os.path.join(a.out, os.path.basename(u).replace(".wav", ""))
            alone = f"{base}.alone.wav"
            simulate(a.tusa, src, alone, "--codec", a.codec, "--playout", "ideal", "--loss", loss)
            scores["alone"].append(score(ref, alone))
            for seed in seeds:
                net = ["--loss", loss, "--burst", burst, "--jitter", jitter, "--seed", seed]
                tag = f"{base}.{loss}-{burst}-{jitter}-{seed}"
                # tusa: FEC, and redundant audio as a call's sender sizes it from the
                # receiver's reports of this network (auto); fec: the same without redundancy.
                for who, extra in (
                    ("baseline", ["--playout", "speex", "--no-fec"]),
                    ("fec", ["--playout", "tusa", "--redundancy", "0"]),
                    ("tusa", ["--playout", "tusa", "--redundancy", "auto"]),
                ):
                    out = f"{tag}.{who}.wav"
                    report = simulate(a.tusa, src, out, "--codec", a.codec, *net, *extra)
                    scores[who].append(score(ref, out))
                    delays[who].append(report.get("meanDelayMilliseconds", 0.0))
                    late[who].append(report.get("lateLossRate", 0.0) * 100)
                    seconds = report["packetsSent"] * report["frameMilliseconds"] / 1000
                    rates[who].append(report["payloadBytes"] * 8 / seconds / 1000 if seconds else 0.0)
                    if who == "tusa":
                        depths.append(report.get("redundancy", 0))
        row = {k: statistics.fmean(v) for k, v in scores.items()}
        row["label"], row["loss"] = label, loss
        row["delay"] = {k: statistics.fmean(v) for k, v in delays.items()}
        row["late"] = {k: statistics.fmean(v) for k, v in late.items()}
        row["rate"] = {k: statistics.fmean(v) for k, v in rates.items()}
        row["depth"] = max(depths) if depths else 0
        rows.append(row)
        print(f"  {label}: alone {row['alone']:.2f}  baseline {row['baseline']:.2f}  fec {row['fec']:.2f}  tusa {row['tusa']:.2f}",
              file=sys.stderr)

    n = len(utterances) * len(seeds)
    print(f"PESQ narrowband (P.862, MOS-LQO), {a.codec}, {len(utterances)} utterances × {len(seeds)} seeds = {n} runs per cell")
    print()
    print("| network | codec alone | baseline (speexdsp jb + PLC) | tusa, FEC only | tusa | tusa − baseline "
          "| redundancy (frames back) | payload kb/s baseline / tusa | delay baseline / FEC only / tusa (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['label']} | {r['alone']:.2f} | {r['baseline']:.2f} | {r['fec']:.2f} | {r['tusa']:.2f} "
              f"| {r['tusa'] - r['baseline']:+.2f} | {r['depth']} | {r['rate']['baseline']:.1f} / {r['rate']['tusa']:.1f} "
              f"| {r['delay']['baseline']:.0f} / {r['delay']['fec']:.0f} / {r['delay']['tusa']:.0f} |")
    print()
    verdicts = []
    clean = next(r for r in rows if r["loss"] == 0)
    ok = clean["tusa"] >= clean["alone"] - 0.1
    verdicts.append(ok)
    print(f"- clean path: tusa {clean['tusa']:.2f} vs codec alone {clean['alone']:.2f} "
          f"(target: within 0.1) — {'met' if ok else 'NOT met'}")
    for r in rows:
        if r["label"] in ("10 % random", "20 % random"):
            gain = r["tusa"] - r["baseline"]
            ok = gain >= 0.3
            verdicts.append(ok)
            print(f"- {r['label']}: tusa − baseline = {gain:+.2f} MOS (target: ≥ +0.3) — {'met' if ok else 'NOT met'}")
        if "bursty" in r["label"]:
            gain = r["tusa"] - r["baseline"]
            ok = gain >= 0.5
            verdicts.append(ok)
            print(f"- {r['label']}: tusa − baseline = {gain:+.2f} MOS (target, issue 19: ≥ +0.5) — {'met' if ok else 'NOT met'}")
    # A --quick run is a smoke test of the tooling: too few runs for a verdict to mean much.
    return 0 if a.quick or all(verdicts) else 2


if __name__ == "__main__":
    sys.exit(main())

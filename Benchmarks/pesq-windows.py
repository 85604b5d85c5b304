#!/usr/bin/env python3
"""PESQ of a long recording, window by window: is the voice as good in the last minute as in the first?

usage:
  pesq-windows.py make OUT.wav IN.wav...
      Joins speech files (mixed down to mono, resampled to 8 kHz) into OUT.wav: the
      reference, which the sender plays over and over (`tusa call --in OUT.wav --loop`).
  pesq-windows.py score REF.wav REC.wav [--every 60] [--window 8] [--skip 3] [--json FILE]
      Cuts the far end's recording REC.wav (8 kHz, what `--out` wrote) into one window of
      --window seconds every --every seconds after the first --skip, finds where in the
      looped reference each window's speech came from (circular cross-correlation, so the
      path's delay and its changes do not matter), and scores the pair with ITU-T P.862
      narrowband PESQ (the `pesq` package in .venv). Prints one line per window, then a
      summary:

        window start_s=63.0 offset_s=12.41 pesq=3.12
        windows=30 pesq_min=2.91 pesq_max=3.30 pesq_mean=3.11 pesq_first=3.05 pesq_last=3.09

      A window the listener heard nothing in scores 1.0 (PESQ's floor), not an error.

Exit status: 0; 2 when a file cannot be read or is too short for one window.
"""
import argparse
import json
import sys
import wave

import numpy as np

RATE = 8000


def read(path: str) -> tuple[np.ndarray, int]:
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * w.getsampwidth()}-bit samples, 16 expected")
        rate, channels = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
    if channels > 1:
        x = x.reshape(-1, channels).mean(axis=1)
    return x, rate


def resample(x: np.ndarray, rate: int, to: int) -> np.ndarray:
    """Band-limited resampling in the frequency domain (whole signal at once: files are short)."""
    if rate == to or len(x) == 0:
        return x
    n = int(round(len(x) * to / rate))
    spectrum = np.fft.rfft(x)
    keep = min(len(spectrum), n // 2 + 1)
    out = np.zeros(n // 2 + 1, dtype=complex)
    out[:keep] = spectrum[:keep]
    return np.fft.irfft(out, n) * (n / len(x))


def write(path: str, x: np.ndarray) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes())


def make(out: str, inputs: list[str]) -> int:
    parts = []
    for path in inputs:
        x, rate = read(path)
        parts.append(resample(x, rate, RATE))
        parts.append(np.zeros(RATE // 4))  # a breath between the clips
    reference = np.concatenate(parts)
    write(out, reference)
    print(f"reference {out}: {len(inputs)} files, {len(reference) / RATE:.1f} s at {RATE} Hz")
    return 0


def score(a: argparse.Namespace) -> int:
    from pesq import pesq  # the .venv's package (scripts/setup.sh installs it)

    reference, rate = read(a.reference)
    recording, recording_rate = read(a.recording)
    reference = resample(reference, rate, RATE)
    recording = resample(recording, recording_rate, RATE)
    size = int(a.window * RATE)
    if size >= len(reference):
        print(f"pesq-windows: the reference ({len(reference) / RATE:.1f} s) must be longer than a window", file=sys.stderr)
        return 2
    starts = []
    t = a.skip
    while (t + a.window) * RATE <= len(recording):
        starts.append(t)
        t += a.every
    if not starts:
        print(f"pesq-windows: {a.recording} ({len(recording) / RATE:.1f} s) is too short for one window", file=sys.stderr)
        return 2
    spectrum = np.fft.rfft(reference)
    looped = np.concatenate([reference, reference])
    rows = []
    for start in starts:
        segment = recording[int(start * RATE) : int(start * RATE) + size]
        padded = np.zeros(len(reference))
        padded[:size] = segment
        correlation = np.fft.irfft(spectrum * np.conj(np.fft.rfft(padded)), len(reference))
        offset = int(np.argmax(correlation))
        source = looped[offset : offset + size]
        if np.sqrt(np.mean(segment**2)) < 1.0:
            mos = 1.0  # nothing heard
        else:
            try:
                mos = float(pesq(RATE, source.astype(np.float32), segment.astype(np.float32), "nb"))
            except Exception as e:  # pesq raises for a window without utterances
                print(f"  (window at {start:.1f} s: {e}; scored 1.0)", file=sys.stderr)
                mos = 1.0
        rows.append({"start": start, "offset": offset / RATE, "pesq": mos})
        print(f"window start_s={start:.1f} offset_s={offset / RATE:.2f} pesq={mos:.2f}", flush=True)
    scores = [r["pesq"] for r in rows]
    summary = {
        "windows": len(rows),
        "min": min(scores),
        "max": max(scores),
        "mean": sum(scores) / len(scores),
        "first": scores[0],
        "last": scores[-1],
        "rows": rows,
    }
    print(
        f"windows={len(rows)} pesq_min={summary['min']:.2f} pesq_max={summary['max']:.2f} "
        f"pesq_mean={summary['mean']:.2f} pesq_first={summary['first']:.2f} pesq_last={summary['last']:.2f}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+")
    s = sub.add_parser("score")
    s.add_argument("reference")
    s.add_argument("recording")
    s.add_argument("--every", type=float, default=60)
    s.add_argument("--window", type=float, default=8)
    s.add_argument("--skip", type=float, default=3)
    s.add_argument("--json")
    a = p.parse_args()
    try:
        return make(a.out, a.inputs) if a.command == "make" else score(a)
    except (OSError, EOFError, ValueError, wave.Error) as e:
        print(f"pesq-windows: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

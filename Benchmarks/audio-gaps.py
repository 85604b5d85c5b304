#!/usr/bin/env python3
"""Where a recording of a steady tone went silent: the outages a listener heard.

usage: audio-gaps.py FILE.wav [--min-ms 100] [--skip-s 1]

Reads a 16-bit WAV (what `tusa answer --out` or `tusa party --out` recorded while
the other end sent `--in tone`), cuts it in 20 ms windows and calls a window silent
when its RMS is below a tenth of the median window's (the tone's level; concealment
that still sounds like the tone counts as heard). Prints one line per silent run of
at least --min-ms after the first --skip-s seconds (the call's start), then a summary:

  gap start_s=12.34 ms=1840
  gaps=2 longest_ms=10240 heard_s=57.1 seconds=60.0

Exit status: 0, or 2 when the file cannot be read or holds no tone at all.
"""
import argparse
import array
import math
import sys
import wave


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("wav")
    p.add_argument("--min-ms", type=float, default=100)
    p.add_argument("--skip-s", type=float, default=1)
    a = p.parse_args()
    try:
        with wave.open(a.wav, "rb") as w:
            if w.getsampwidth() != 2:
                print(f"audio-gaps: {a.wav}: {8 * w.getsampwidth()}-bit samples, 16 expected", file=sys.stderr)
                return 2
            rate, channels = w.getframerate(), w.getnchannels()
            samples = array.array("h", w.readframes(w.getnframes()))
    except (OSError, EOFError, wave.Error) as e:
        print(f"audio-gaps: {a.wav}: {e}", file=sys.stderr)
        return 2
    if sys.byteorder == "big":
        samples.byteswap()
    samples = samples[::channels]
    step = rate // 50
    rms = []
    for i in range(0, len(samples) - step + 1, step):
        window = samples[i:i + step]
        rms.append(math.sqrt(sum(s * s for s in window) / step))
    if not rms:
        print(f"audio-gaps: {a.wav}: shorter than one window", file=sys.stderr)
        return 2
    level = sorted(rms)[len(rms) // 2]
    if level < 100:
        print(f"audio-gaps: {a.wav}: no tone (median window RMS {level:.0f})", file=sys.stderr)
        return 2
    first = int(a.skip_s * 50)
    gaps, start = [], None
    for k in range(first, len(rms) + 1):
        silent = k < len(rms) and rms[k] < level / 10
        if silent and start is None:
            start = k
        elif not silent and start is not None:
            if (k - start) * 20 >= a.min_ms:
                gaps.append((start, k - start))
            start = None
    for s, n in gaps:
        print(f"gap start_s={s / 50:.2f} ms={n * 20}")
    silent = sum(1 for r in rms[first:] if r < level / 10)
    print(f"gaps={len(gaps)} longest_ms={max((n * 20 for _, n in gaps), default=0)} "
          f"heard_s={(len(rms) - first - silent) / 50:.1f} seconds={len(rms) / 50:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

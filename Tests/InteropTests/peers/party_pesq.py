"""Inputs and scores for the party test (Tests/InteropTests/PartyCommandTests.swift).

prepare OUT TUSA SPEECH...: for member k, OUT/in-k.wav: silence, then utterance k
  (8 kHz, as `tusa voice simulate --codec l16 --playout ideal` resamples it), then
  silence, so that the members speak in turn; OUT/ref-k.wav is utterance k alone.
  Prints each utterance's start and length in seconds as JSON.
score OUT N: for each member's recording OUT/out-L.wav and each other speaker k,
  finds utterance k in it by cross-correlation, cuts it out and scores it with PESQ
  (P.862 narrowband) against OUT/ref-k.wav. Prints {"L,k": score} as JSON.
"""
import json
import subprocess
import sys
import wave

import numpy as np
from pesq import pesq

RATE = 8000
FIRST = 6.0   # seconds of silence before the first utterance (every member has joined, even on a slow machine)
GAP = 1.5     # seconds between utterances


def read(path):
    with wave.open(path) as w:
        assert w.getframerate() == RATE, f"{path}: {w.getframerate()} Hz"
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


def write(path, samples):
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.astype(np.int16).tobytes())


def prepare(out, tusa, speech):
    refs = []
    for k, s in enumerate(speech):
        ref = f"{out}/ref-{k}.wav"
        subprocess.run([tusa, "voice", "simulate", "--in", s, "--out", ref, "--codec", "l16", "--playout", "ideal"],
                       check=True, capture_output=True)
        refs.append(read(ref))
    starts, t = [], FIRST
    for r in refs:
        starts.append(t)
        t += len(r) / RATE + GAP
    total = int((t + 1) * RATE)
    for k, r in enumerate(refs):
        x = np.zeros(total, dtype=np.int16)
        i = int(starts[k] * RATE)
        x[i:i + len(r)] = r
        write(f"{out}/in-{k}.wav", x)
    print(json.dumps({"starts": starts, "lengths": [len(r) / RATE for r in refs], "total": total / RATE}))


def locate(rec, ref):
    """The offset in rec where ref matches best (FFT cross-correlation)."""
    n = len(rec) + len(ref)
    size = 1 << (n - 1).bit_length()
    c = np.fft.irfft(np.fft.rfft(rec.astype(np.float64), size) * np.conj(np.fft.rfft(ref.astype(np.float64), size)), size)
    return int(np.argmax(c[: len(rec) - len(ref) + 1])) if len(rec) >= len(ref) else 0


def score(out, n):
    scores = {}
    for listener in range(n):
        rec = read(f"{out}/out-{listener}.wav")
        for k in range(n):
            if k == listener:
                continue
            ref = read(f"{out}/ref-{k}.wav")
            if len(rec) < len(ref):
                scores[f"{listener},{k}"] = 0.0
                continue
            at = locate(rec, ref)
            cut = rec[at: at + len(ref) + RATE // 5]
            scores[f"{listener},{k}"] = round(float(pesq(RATE, ref.astype(np.float64), cut.astype(np.float64), "nb")), 3)
    print(json.dumps(scores))


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        score(sys.argv[2], int(sys.argv[3]))

"""What one listener heard, scored: `heard_pesq.py REF REC` finds REF (8 kHz mono WAV)
in the recording REC (8 kHz mono WAV, e.g. a sound server's sink recorded with parec) by
cross-correlation, cuts it out and scores it with PESQ (P.862 narrowband). Prints
{"pesq": score, "at": seconds into REC where REF starts} as JSON; a recording shorter than
REF scores 0.
"""
import json
import sys

import numpy as np
from pesq import pesq

from party_pesq import RATE, locate, read


def main(ref_path, rec_path):
    ref = read(ref_path)
    rec = read(rec_path)
    if len(rec) < len(ref):
        print(json.dumps({"pesq": 0.0, "at": 0.0}))
        return
    at = locate(rec, ref)
    cut = rec[at: at + len(ref) + RATE // 5]
    score = float(pesq(RATE, ref.astype(np.float64), cut.astype(np.float64), "nb"))
    print(json.dumps({"pesq": round(score, 3), "at": round(at / RATE, 3)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

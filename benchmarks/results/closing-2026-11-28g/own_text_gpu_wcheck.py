"""sha256 over a safetensors file's tensors (sorted names, dtype, shape, bytes): python3 wcheck.py FILE [WANT]."""
import hashlib, sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1]); h = hashlib.sha256()
for k in sorted(t):
    a = t[k]; h.update(f"{k}|{a.dtype}|{a.shape}|".encode()); h.update(a.tobytes())
d = h.hexdigest(); print("weights sha256", d, len(t), "tensors")
sys.exit(0 if len(sys.argv) < 3 or d == sys.argv[2] else 1)

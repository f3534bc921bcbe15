"""10,000 calls in a loop do not grow the process: every tensor, thread and Python object
a call makes is freed when it returns."""
import numpy as np

import qkv
from conftest import FOLDERS


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def growth_over(calls, fn, warmup=500):
    for _ in range(warmup):  # the allocator's caches and the thread pool reach their size
        fn()
    before = rss_kib()
    for _ in range(calls):
        fn()
    return rss_kib() - before


def test_generate_translate_and_tensors_do_not_grow_rss():
    lm = qkv.load(FOLDERS / "decoder")
    tr = qkv.load(FOLDERS / "transformer")
    a = np.ones((64, 64), dtype=np.float32)
    # 10,000 calls of each; a leak of even 100 bytes a call would show as ~1 MiB.
    # The bound leaves room for the allocator's own bookkeeping, not for a per-call leak.
    assert growth_over(10_000, lambda: lm.generate("hello", max_new_tokens=2, temperature=0)) < 1024
    assert growth_over(10_000, lambda: tr.translate(["你好"], max_len=2)) < 1024
    assert growth_over(10_000, lambda: qkv.from_dlpack(a).numpy().sum()) < 1024
    assert growth_over(10_000, lambda: list(lm.generate("hi", max_new_tokens=2, stream=True))) < 1024

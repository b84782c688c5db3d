import json
import os
import platform
import subprocess
import sys

import pytest

from vit_flowers.inference import runtime

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# Allocates and frees a 48 MiB tensor (over glibc's largest automatic mmap threshold) 20 times after 10 rounds
# of warm-up, writing it each time, and prints the minor page faults those 20 rounds cost.
_FAULTS = """
import json, resource, sys, torch
from vit_flowers.inference.runtime import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
for _ in range(10):  # the first rounds fault either way (5-7 of them here), while the heap settles
    torch.empty(12 << 20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.empty(12 << 20).fill_(1.0)
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], env={**environ, **env}, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_keep_freed_memory_stops_the_page_faults_of_reallocating_a_freed_block():
    default, kept = _faults("default"), _faults("keep")
    assert kept["applied"] is True
    pages = (48 << 20) // 4096
    assert default["faults"] > 10 * pages  # each round maps the block afresh and faults on every page
    assert kept["faults"] < pages  # reused: not even one round's worth of fresh pages


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_users_own_malloc_settings_win():
    assert _faults("keep", MALLOC_TRIM_THRESHOLD_="0")["applied"] is False
    assert _faults("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")["applied"] is False


def test_does_nothing_off_glibc(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.keep_freed_memory() is False

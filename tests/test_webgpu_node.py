"""WebGPU under Node (the npm package `webgpu`, Dawn) on SwiftShader: `node --test tests/gpu/` with
the environment that finds the package and the software Vulkan driver (Chromium's SwiftShader).
What runs there: the registry picking by measurement (tests/gpu/backends.test.mjs) and the
resident step's kernels against their JS twins, bit for bit (tests/gpu/resident*.test.mjs);
`node frontend_js/cli.mjs --gpu all` = `python -m daisy.train` line for line.
.ci/run installs the package into .gpu/ (gitignored)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.reference import first_diff

ROOT = Path(__file__).resolve().parents[1]
NODE = shutil.which("node")
CHROMIUM_LIB = Path("/usr/lib/chromium")


def gpu_env():
    env = dict(os.environ)
    env["NODE_PATH"] = str(ROOT / ".gpu" / "node_modules")
    env["LD_LIBRARY_PATH"] = str(CHROMIUM_LIB)
    env["VK_ICD_FILENAMES"] = str(CHROMIUM_LIB / "vk_swiftshader_icd.json")
    return env


@pytest.fixture(scope="module", autouse=True)
def webgpu_package():
    assert (ROOT / ".gpu" / "node_modules" / "webgpu").is_dir(), "the webgpu package is missing: .ci/run installs it into .gpu/"
    assert (CHROMIUM_LIB / "vk_swiftshader_icd.json").is_file(), "Chromium's SwiftShader is missing: .ci/run installs chromium"


def test_node_gpu_tests():
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "gpu").glob("*.test.mjs"))
    assert len(files) >= 1, files
    r = subprocess.run([NODE, "--test", "--test-concurrency=1", *files], cwd=ROOT, env=gpu_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-6000:] + r.stderr[-3000:])


def test_cli_on_the_gpu_equals_the_reference():
    args = ["--peers", "2", "--steps", "100", "--stop-after", "3", "--width", "16", "--seq-len", "16", "--batch", "2",
            "--layers", "1", "--heads", "2", "--json"]
    py = subprocess.run(["python3", "-m", "daisy.train", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    js = subprocess.run([NODE, "frontend_js/cli.mjs", "--gpu", "all", *args], cwd=ROOT, env=gpu_env(),
                        capture_output=True, text=True, timeout=300)
    assert py.returncode == 0 and js.returncode == 0, (py.stderr[-2000:], js.stderr[-2000:])
    assert "compute: GPU (WebGPU, every GEMM)" in js.stderr, js.stderr[-2000:]
    assert js.stdout == py.stdout, first_diff(py.stdout, js.stdout)

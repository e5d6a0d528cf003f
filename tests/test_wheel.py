"""The wheel works as well as the checkout: built and installed non-editable in a fresh environment, it carries its
C kernels (every kernel builds from the installed sources, none falls back, and their ops' C++ kernels build too),
the shipped recipes and evals, and `quantlab init` writes a recipe that runs there."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
C_KERNELS = ("lut4_cpu", "bitplane_cpu", "fp8_cpu", "ggml_repack_cpu")


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh virtual environment holding the built wheel, with this environment's dependencies (torch, ...)
    visible through a path file, so nothing is downloaded; the checkout is not on its path."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next((tmp / "dist").glob("quantlab-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300)
    python = tmp / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    work = tmp / "work"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{tmp / 'venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": ""}
    return work, env


def run(args: list[str], work: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_installed_wheel_is_not_the_checkout_and_carries_every_kernel(wheel_env) -> None:
    work, env = wheel_env
    where = run(["python", "-c", "import quantlab; print(quantlab.__file__)"], work, env)
    assert where.returncode == 0 and "site-packages" in where.stdout and str(ROOT) not in where.stdout
    listing = run(["quantlab", "formats", "--kernels"], work, env)
    assert listing.returncode == 0, listing.stderr[-2000:]
    for kernel in C_KERNELS:
        assert f"CPU kernel: {kernel}" in listing.stdout, (kernel, listing.stdout)
    # every library that ships an ops source, found in the installed package rather than named here
    ops = run(["python", "-c", "from quantlab import native; "
               "names = sorted(p.name.removesuffix('_ops.cpp') for p in native.SOURCES.glob('*_ops.cpp')); "
               "print(len(names), all(native.load_ops(n) for n in names), names, native.OPS_FAILURES)"], work, env)
    assert ops.returncode == 0, ops.stderr[-2000:]
    count, built = ops.stdout.split()[:2]
    checkout = len(list((ROOT / "quantlab" / "native" / "src").glob("*_ops.cpp")))
    assert int(count) == checkout and built == "True", (checkout, ops.stdout)


@pytest.mark.slow
def test_init_writes_recipes_that_run_from_the_installed_wheel(wheel_env) -> None:
    work, env = wheel_env
    listed = run(["quantlab", "init", "--list"], work, env)
    assert listed.returncode == 0 and "quickstart" in listed.stdout and "gemma3-270m" in listed.stdout
    starter = run(["quantlab", "init", "starter"], work, env)
    assert starter.returncode == 0, starter.stderr
    example = run(["quantlab", "init", "--example", "quickstart"], work, env)
    assert example.returncode == 0 and (work / "quickstart.yaml").is_file()
    check = run(["python", "-c", "from quantlab import load_recipe; print(len(load_recipe('starter.yaml').variants()))"],
                work, env)
    assert check.returncode == 0 and check.stdout.strip() == "10", check.stderr
    # the quickstart as README gives it for an installed wheel, cut to two variants to stay short
    text = (work / "quickstart.yaml").read_text()
    text = text.replace("  - fp16\n", "").replace("  - format: gptq\n    bits: 4\n    group_size: 128\n    compute_dtype: "
                                                   "bfloat16\n", "").replace("export:", "export_unused:")
    text = text.split("export_unused:")[0]
    (work / "quickstart.yaml").write_text(text.replace("  - bf16\n", ""))
    done = run(["quantlab", "run", "quickstart.yaml"], work, env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "smallest within tolerance" in done.stdout and done.stdout.rstrip().splitlines()[-1].endswith("report.md")
    assert (work / "reports" / "quickstart" / "report.html").is_file()

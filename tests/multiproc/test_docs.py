"""The documentation is a test: every ```bash and ```python block of the README and of
docs/**/*.md runs as written (a block that appears in several pages, once).

Each block runs in its own process, from a user's shell (no TF_USE_LEGACY_KERAS, no PYTHONPATH),
with TFPAR_EPOCHS=1 to shorten `tfpar demo` and the examples. Bash blocks run in the checkout
(they name examples/), Python blocks in a temporary folder (they write files). The README's first
block installs into a new virtual environment from a copy of the checkout; the second is the
command `.ci/run` runs, checked to be the same text. The site itself is built with
`mkdocs build --strict` and three of its pages are looked at in Chromium (tests/unit/test_site.py).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, USER_SHELL, document_blocks, run_command

SHELL = {**USER_SHELL, "TFPAR_EPOCHS": "1"}
INSTALL_AND_DEMO = "pip install . && tfpar demo"
INSTALL_AND_TEST = 'pip install -e ".[dev,horovod]" && tfpar install-horovod && python -m pytest'
# What a block must print besides exiting 0, keyed by a fragment of the block.
EXPECT = {
    "strategy = tfpar.DataParallel()   # a real": ["MirroredDataParallel", "Epoch 3/3"],
    "tfpar launch -n 2 --": ["[worker 0]", "[worker 1]"],
    "--nnodes 2 --node-rank 1": [
        "node 1 of 2: workers 1 to 1 of 2",
        "node 0 of 2: workers 0 to 0 of 2",
        "MultiWorkerDataParallel",
    ],
    "HorovodStrategy(op=": ["HorovodStrategy", "Epoch 2/2"],
    "Pipeline(num_stages=2": ["Epoch 2/2"],
    "parallelism.build(": ["23/23", "32 per replica, 64 global"],
    "keras_tuner.RandomSearch(": ["best: {'units':"],
    "TensorflowTrainer(train_loop": ["Ray reported: {", "'epoch': 2"],
    "quantization.quantize(": ["Epoch 2/2"],
    "q.cluster(pruned": ["smaller gzipped", "distinct values", "of the weights are zero"],
    "tfpar verify --model tfpar.demo": [
        "PASSED: trains like one replica",
        "conv2d/kernel",
        "zero:       stage 1: each replica keeps and updates 1/2 of the optimizer state",
    ],
    "tensor_parallel=2)   # first": ["mesh:       data 1 x pipeline 2 x tensor 2"],
    "TensorParallel(degree=2, plan=plan)": ["'block0_attention': 'heads'", "'block1_down': 'row'"],
    "TensorParallel(degree=2)": [
        "mesh: data 1 x pipeline 1 x tensor 2",
        "'block1_down': 'row'",
        "Epoch 2/2",
    ],
    "tfpar demo --strategy tensor_parallel": [
        "TensorParallel (mesh: data 1 x pipeline 1 x tensor 2)",
        "'block1_attention': 'heads'",
        "validation accuracy",
        "mesh:       data 1 x pipeline 2 x tensor 2",
        "PASSED: trains like one replica",
    ],
    "check_coverage(": ["missing: 0", "duplicated: 0"],
    "TensorParallel.from_distribution(distribution)": [
        "TensorParallel (mesh: data 1 x pipeline 1 x tensor 2)",
        "/attention/query': 'column:0'",
        "Epoch 2/2",
    ],
    "# gpt2_check.py": ["parameters, 64 examples"],
    "model = pipeline.stage(gpt2)": ["stage 0:", "transformer_layer_1", "Epoch 2/2"],
    "tfpar.optimizers.LAMB(2e-3": ["LAMB steps: 4"],
    "scaled_learning_rate(5e-3": ["rate at batch 1024: 0.02"],
    'DataParallel(remat="blocks")': [
        "remat:      2 block(s) recompute their activations in the backward pass",
        "transformer_layer_0, transformer_layer_1",
    ],
    "DataParallel(zero_stage=3)": [
        "zero:       stage 3: each replica keeps and updates 1/2 of the parameters",
        "weights 88,104 B -> 44,052 B",
    ],
    "DataParallel(zero_stage=1)": [
        "zero:       stage 1: each replica keeps and updates 1/2 of the optimizer state",
        "optimizer state 22,096 B -> 11,048 B",
    ],
    "train_pipeline.py --span-workers": [
        "(stages over the devices of 2 workers; worker 0 runs it)",
        "/job:worker/replica:0/task:1/device:CPU:0']]",
        "tfpar server: worker 1 serving",
        "validation accuracy of the saved plain model",
    ],
}

RAY_OWN_ACTORS = re.compile(r"\((TrainController|PlacementGroupCleaner) pid=\d+\)")
BLOCKS = document_blocks()
README_BLOCKS = [block for block in BLOCKS if block[0] == "README.md"]

# Blocks another test runs as written, in the user's shape and with more checks: run once, there.
RUN_ELSEWHERE = {
    "ParameterServer.local(": "tests/multiproc/test_loopback.py (a plain script, its sockets "
    "watched)"
}
# Lines of bash blocks that another test runs as written (tests.conftest.docs_command), from a
# user's shell, with more checks (the demos to their accuracy targets at their default epochs; an
# example with options of its own added): the block runs without them.
LINES_RUN_ELSEWHERE = {
    "tfpar doctor": "tests/conftest.py",
    "tfpar tune --target val_accuracy=0.95": "tests/multiproc/test_tune.py",
    "tfpar demo --strategy horovod": "tests/multiproc/test_horovod.py",
    "horovodrun -np 2 -H localhost:2 --gloo python examples/train_horovod.py": (
        "tests/multiproc/test_horovod.py"
    ),
    "tfpar demo --strategy parameter_server": "tests/multiproc/test_parameter_server.py",
    "tfpar demo --strategy pipeline": "tests/multiproc/test_pipeline.py",
    "python examples/train_data_parallel.py": "tests/multiproc/test_examples.py",
    "tfpar launch --nproc-per-node 2 -- python examples/train_data_parallel.py": (
        "tests/multiproc/test_data_parallel_multiworker.py"
    ),
}


def _without_lines_run_elsewhere(language, text):
    if language != "bash":
        return text
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if line.split("#", 1)[0].strip() not in LINES_RUN_ELSEWHERE
    )


RUNNABLE = [
    (document, language, _without_lines_run_elsewhere(language, text), line)
    for document, language, text, line in BLOCKS
    if text.strip() not in (INSTALL_AND_DEMO, INSTALL_AND_TEST)
    and not any(fragment in text for fragment in RUN_ELSEWHERE)
]
RUNNABLE = [block for block in RUNNABLE if block[2].strip()]


def test_the_setup_is_the_two_documented_commands():
    commands = [text.strip() for _, _, text, _ in README_BLOCKS[:2]]
    assert commands == [INSTALL_AND_DEMO, INSTALL_AND_TEST]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line.strip() for line in f]
    assert INSTALL_AND_TEST in ci, "`.ci/run` must run the README's test command as written"


def test_the_readme_is_a_landing_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 150
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every link into the site reaches a page
        assert os.path.isfile(os.path.join(ROOT, link)), link


def test_install_and_demo_on_a_new_environment(tmp_path):
    """``pip install . && tfpar demo`` in a new virtual environment, from a copy of the checkout,
    the demo as a new user gets it: its default epochs, to its accuracy target.
    The environment running the tests lends its packages through a .pth file (whether it is a
    venv or not), so only tfpar itself is installed."""
    import sysconfig

    source = tmp_path / "tfpar"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", "site"
        ),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    ).stdout.strip()
    outer = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site) / "_tfpar_test_outer.pth").write_text("\n".join(outer) + "\n")
    env = {
        **USER_SHELL,
        "TFPAR_EPOCHS": None,
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(venv),
    }
    result = run_command(
        ["bash", "-e", "-c", INSTALL_AND_DEMO], timeout=600, env=env, cwd=str(source)
    )
    assert result.returncode == 0, result.output[-4000:]
    assert (venv / "bin" / "tfpar").exists()
    assert (
        "MirroredDataParallel (MirroredStrategy)" in result.output
        and "replicas:   2" in result.output
    )
    assert "epochs:              8" in result.output
    accuracy = float(re.search(r"validation accuracy: ([0-9.]+)", result.output).group(1))
    assert accuracy >= 0.95, result.output[-3000:]
    assert (
        float(re.search(r"examples/second:\s+([0-9,]+)", result.output).group(1).replace(",", ""))
        > 0
    )
    # What the installed package says of itself: its version, and a strategy's options in help().
    import tfpar

    after = run_command(
        [
            "bash",
            "-e",
            "-c",
            "tfpar --version && python -c 'import tfpar; help(tfpar.DataParallel)'",
        ],
        timeout=300,
        env={**env, "PAGER": "cat"},
        cwd=str(tmp_path),
    )
    assert after.returncode == 0, after.output[-3000:]
    assert f"tfpar {tfpar.__version__}" in after.output
    assert (
        "DataParallel(config: 'DataParallelConfig | None' = None, *, devices: tuple | None = None, "
        "all_reduce: str = 'auto'" in after.output
    ), after.output[:3000]


@pytest.mark.parametrize(
    "document, language, text, line",
    [
        pytest.param(
            *block,
            id=f"{block[0]}:{block[3]}",
            marks=[pytest.mark.xdist_group("ray")] if "import ray" in block[2] else [],
        )
        for block in RUNNABLE
    ],
)
def test_documented_block_runs_as_written(document, language, text, line, tmp_path, request):
    if "horovod" in text.lower():
        request.getfixturevalue("horovod_installed")
    if language == "bash":
        result = run_command(["bash", "-e", "-c", text], timeout=600, env=SHELL)
    else:
        script = tmp_path / "block.py"
        script.write_text(text)
        result = run_command(
            [sys.executable, str(script)], timeout=600, env=SHELL, cwd=str(tmp_path)
        )
    where = f"{document} line {line}"
    assert result.returncode == 0, f"{where}:\n{result.output[-4000:]}"
    # No exception in the block's own processes. Ray's controller logs the errors of its own
    # requests that it retries (measured on a loaded CI run: the autoscaling coordinator's
    # GetTimeoutError, and training went on): those lines are Ray's, not the block's.
    own = "\n".join(line for line in result.output.splitlines() if not RAY_OWN_ACTORS.search(line))
    assert "Traceback" not in own, result.output[-4000:]
    for fragment, expected in EXPECT.items():
        if fragment in text:
            for piece in expected:
                assert piece in result.output, (
                    f"{where}: {piece!r} not printed:\n{result.output[-3000:]}"
                )


def test_each_block_run_elsewhere_is_one_block():
    """A fragment of RUN_ELSEWHERE leaves out the one block it names, never another."""
    for fragment in RUN_ELSEWHERE:
        assert sum(fragment in text for _, _, text, _ in BLOCKS) == 1, fragment


def test_each_line_run_elsewhere_is_run_there_as_the_documentation_writes_it():
    for command, path in LINES_RUN_ELSEWHERE.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            source = f.read()
        # the call as ruff formats it: its argument may stand on a line of its own
        argument = re.escape(f"{command!r}".replace("'", '"'))
        assert re.search(rf"docs_command\(\s*{argument}\s*\)", source), (command, path)


def test_every_runnable_block_is_checked_for_its_output():
    unchecked = [
        f"{document}:{line}"
        for document, _, text, line in RUNNABLE
        if not any(fragment in text for fragment in EXPECT)
    ]
    assert unchecked == [], f"blocks with no expected output in EXPECT: {unchecked}"

"""The documentation site: ``mkdocs build --strict`` passes, fails on a broken link or a reference
that does not resolve, and three built pages, rendered in headless Chromium, show their heading
and no unresolved reference.

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it when missing); outside CI a
machine without it skips the rendering test, under ``CI=true`` it fails.
"""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_command

# Pages the issue names: the home page, choosing a strategy, one API page. (path, its h1)
PAGES = [
    ("index.html", "tfpar"),
    ("choosing/index.html", "Choosing a strategy"),
    ("reference/api/strategies/index.html", "tfpar.strategies"),
]
# What an unresolved reference or a failed generation leaves in a page.
UNRESOLVED = ("::: tfpar", "<!-- tfpar:", "Could not collect", "autorefs-not-found", "[tfpar.")


def _build(config_dir, site):
    return run_command(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        timeout=300,
        cwd=str(config_dir),
        env={"NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    result = _build(ROOT, folder)
    assert result.returncode == 0, result.output[-4000:]
    assert "WARNING" not in result.output, result.output[-4000:]
    return folder


def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.load(f, Loader=yaml.BaseLoader)  # its !!python tags are not needed here

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from (pages(value) if isinstance(value, list) else [value])

    for page in pages(config["nav"]):
        built = site / (page[:-3] + ".html" if page == "index.md" else page[:-3] + "/index.html")
        assert built.is_file(), page
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in (
        "tfpar launch",
        "--nproc-per-node",
        "--master-addr",
        "tfpar verify",
        "install-horovod",
    ):
        assert command in cli, command  # generated from the parsers
    assert "(default: 29500)" in cli and "124" in cli


@pytest.mark.parametrize(
    "breakage, named",
    [
        ("[a page that is not there](nowhere.md)", "nowhere.md"),
        ("::: tfpar.strategies.data_parallel.NoSuchStrategy", "NoSuchStrategy"),
    ],
)
def test_a_broken_link_or_reference_fails_the_build(tmp_path, breakage, named):
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "concepts.md", "a", encoding="utf-8") as f:
        f.write(f"\n\n{breakage}\n")
    result = _build(tmp_path, tmp_path / "site")
    assert result.returncode != 0 and named in result.output, result.output[-3000:]


def _chromium():
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = (
            "Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.mark.parametrize("page, heading", PAGES, ids=[p for p, _ in PAGES])
def test_a_page_renders_in_chromium_with_its_heading(site, page, heading, tmp_path):
    """Chromium renders the page (its DOM after scripts ran) and saves a screenshot: the heading is
    there, no reference is left unresolved, and the picture is a page, not a blank."""
    chromium = _chromium()
    url = (site / page).as_uri()
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,1400",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = run_command([chromium, *flags, "--dump-dom", url], timeout=120, cwd=str(tmp_path))
    assert dom.returncode == 0, dom.output[-2000:]
    import re

    titles = [
        re.sub(r"<[^>]+>", "", t).replace("¶", "").strip()
        for t in re.findall(r"<h1[^>]*>(.*?)</h1>", dom.output, re.S)
    ]
    assert heading in titles, titles
    assert not [text for text in UNRESOLVED if text in dom.output]
    picture = tmp_path / (page.replace("/", "_") + ".png")
    shot = run_command(
        [chromium, *flags, f"--screenshot={picture}", url], timeout=120, cwd=str(tmp_path)
    )
    assert shot.returncode == 0 and picture.is_file(), shot.output[-2000:]
    keep = os.environ.get("TFPAR_SCREENSHOTS")  # a folder to keep them in, to look at
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(picture, keep)
    assert _distinct_colours(picture) > 50  # text and the theme's header, not an empty page


def _distinct_colours(path):
    """The number of distinct RGB colours of a PNG (matplotlib reads it: a dev dependency)."""
    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(str(path))[..., :3]
    return len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))


def test_the_site_is_not_left_in_the_checkout():
    """`mkdocs build` writes site/ by default: it is ignored, never committed."""
    done = subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT, timeout=30)
    assert done.returncode == 0

"""A site overlay of signatures and Xid overrides (setting ``signatures_overlay``)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.cli.main import main as cli_main
from trainmedic.core.errors import InputError
from trainmedic.core.models import GpuTelemetry
from trainmedic.core.settings import get_settings
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis import LogSource, diagnose, load_catalogue, site_catalogue
from trainmedic.diagnosis.overlay import load_with_overlay

SITE = """
[prefilter]
anchors = ['lustre evict']

[[signature]]
id = "lustre-evicted"
category = "StorageError"
weight = 0.9
regex = '''Lustre evicted by (?P<host>[a-z][\\w.-]*)'''
examples = ["kernel: Lustre evicted by mds01"]

[[signature]]
id = "nccl-warn"
category = "NetworkError"
role = "symptom"
weight = 0.3
regex = '''NCCL WARN'''
examples = ["node003:1:2 [0] NCCL WARN Error : ring 0 does not loop back to start"]

[xid.overrides]
13 = { category = "ECCError", kind = "hardware" }
94 = "GPUFallenOff"
"""


@pytest.fixture
def overlay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "site-signatures.toml"
    path.write_text(SITE)
    monkeypatch.setenv("TRAINMEDIC_SIGNATURES_OVERLAY", str(path))
    get_settings.cache_clear()
    yield path
    get_settings.cache_clear()
    load_with_overlay.cache_clear()


def _diagnose(line: str, **options):
    return diagnose([LogSource.from_text("node007.log", line)], **options)


def test_without_the_setting_the_packaged_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINMEDIC_SIGNATURES_OVERLAY", raising=False)
    get_settings.cache_clear()
    assert site_catalogue() is load_catalogue()


def test_overlay_adds_and_replaces_signatures(overlay: Path) -> None:
    catalogue = site_catalogue()
    assert site_catalogue() is catalogue  # read once
    ids = [s.id for s in catalogue.signatures]
    packaged = [s.id for s in load_catalogue().signatures]
    assert ids == [*packaged, "lustre-evicted"]  # replaced in place, added at the end
    assert catalogue.by_id("nccl-warn").category is Category.NetworkError
    assert "lustre evict" in catalogue.anchors

    evicted = _diagnose("[42.1] kernel: Lustre evicted by mds01", catalogue=catalogue)
    assert evicted.category is Category.StorageError
    assert evicted.evidence[0].signature == "lustre-evicted"
    assert evicted.root_cause_host == "mds01"
    # The engine's default catalogue is the site's.
    assert _diagnose("kernel: Lustre evicted by mds01").category is Category.StorageError
    assert load_catalogue().by_id("nccl-warn").category is Category.NCCLError  # untouched


def test_xid_overrides_reach_log_lines_and_telemetry(overlay: Path) -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)"
    assert _diagnose(line, catalogue=load_catalogue()).category is Category.CUDAError
    site = _diagnose(line)
    assert site.category is Category.ECCError
    assert site.evidence[0].signature == "xid-ECCError"  # no longer the application's fault
    assert site_catalogue().xid[94].category is Category.GPUFallenOff
    reading = GpuTelemetry(host="node007", gpu=0, xid_last=94)
    assert diagnose([], telemetry=[reading]).category is Category.GPUFallenOff
    assert diagnose([], telemetry=[reading], catalogue=load_catalogue()).category is (
        Category.ECCError
    )


BAD = [
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregex = '('\nexamples = ['(']\n",
        "signature[0].regex='(': bad regex",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'Nope'\nregex = 'x'\nexamples = ['x']\n",
        "signature[0].category='Nope': not one of",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregex = 'quux'\nexamples = ['quux']\n",
        "signature[0].examples[0]='quux': no prefilter anchor lets it through",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregex = 'ECC x'\nexamples = ['y']\n",
        "signature[0].examples[0]='y': the regex does not match it",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregex = 'ECC'\n",
        "signature[0].examples=None: at least one example",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregex = 'ECC'\nexamples = ['ECC']\n"
        "weight = 3\n",
        "signature[0].weight=3: a number from 0 to 1",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregex = 'ECC'\nexamples = ['ECC']\n"
        "peer = 'yes'\n",
        "signature[0].peer='yes': must be a bool",
    ),
    (
        "[[signature]]\nid = 'x'\ncategory = 'ECCError'\nregx = 'ECC'\n",
        "signature[0].regx='ECC': not a signature field",
    ),
    ("[xid.overrides]\n13 = 'Broken'\n", "xid.overrides.13.category='Broken': not one of"),
    ("[xid.overrides]\nthirteen = 'ECCError'\n", "xid.overrides.thirteen='thirteen'"),
    (
        "[xid.overrides]\n13 = { category = 'ECCError', kind = 'cosmic' }\n",
        "xid.overrides.13.kind='cosmic'",
    ),
    ("[prefilter]\nanchors = ['(']\n", "prefilter.anchors[0]='(': bad regex"),
    ("[prefilter]\nanchors = ['NCCL']\n", "prefilter.anchors[0]='NCCL': templates are lowercased"),
    ("[signatures]\n", "signatures={}: not an overlay table"),
    ("[[signature]\n", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e for _, e in BAD])
def test_a_bad_overlay_is_one_line_naming_file_field_value(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_with_overlay(str(path))
    message = str(caught.value)
    assert message.startswith(str(path)) or f"'{path}'" in message
    assert expected in message
    assert "\n" not in message


def test_a_missing_overlay_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"signatures_overlay='.*nope\.toml': cannot be read"):
        load_with_overlay(str(tmp_path / "nope.toml"))


def test_the_cli_prints_one_line_for_a_bad_overlay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[xid.overrides]\n13 = 'Broken'\n")
    log = tmp_path / "node001.log"
    log.write_text("NCCL WARN x\n")
    monkeypatch.setenv("TRAINMEDIC_SIGNATURES_OVERLAY", str(bad))
    get_settings.cache_clear()
    try:
        code = cli_main(["classify", str(log)])
    finally:
        get_settings.cache_clear()
        load_with_overlay.cache_clear()
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{bad}: xid.overrides.13.category='Broken'" in err
    assert io.StringIO(err).readline().startswith("trainmedic")


def test_the_documented_example_loads(tmp_path: Path) -> None:
    readme = Path(__file__).resolve().parents[2] / "trainmedic/diagnosis/data/README.md"
    text = readme.read_text()
    example = text[text.index("```toml\n", text.index("## A site overlay")) + 8 :]
    path = tmp_path / "site.toml"
    path.write_text(example[: example.index("```")])
    catalogue = load_with_overlay(str(path))
    assert catalogue.by_id("lustre-evicted").category is Category.StorageError
    assert catalogue.xid[64].category is Category.ECCError
    assert catalogue.xid[72].kind == "application"

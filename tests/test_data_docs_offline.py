"""Data Docs offline: CDN URLs rewritten to the site's vendored copies, without GE.

The rewrite is a pure function of a page and its depth, compared exactly; the
I/O is checked on a small hand-made site. A real site after a validation is
checked in tests/test_validate.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from applier.validate.offline import ASSETS, VENDOR_DIR, make_offline, offline_html, remote_assets

# Lines as GE 1.x's templates write them.
PAGE = """<link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css"/>
<link rel="stylesheet" type="text/css" href="https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css">
<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>
<script src="https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js" integrity="sha384-ApNbgh9B+Y1QKtv3Rn7W3mgPxhU9K/ScQsAP7hUibX39j7fakFPskvXusvfa0b4Q" crossorigin="anonymous"></script>
<link rel="shortcut icon" href="../../static/images/favicon.ico" type="image/x-icon"/>
          <img
            class="NO-CACHE"
            src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=20261126T091224.234209Z"
            alt="Great Expectations"
          />
  .navbar-brand a {
    background: url('https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/full_logo_dark.png') 0 0 no-repeat;
  }
<p>Stay current <a href="https://greatexpectations.io/newsletter?utm_source=datadocs">Subscribe</a></p>
<script src="https://example.com/new-in-a-ge-upgrade.js" integrity="sha384-x" crossorigin="anonymous"></script>
"""  # noqa: E501

OFFLINE_AT_DEPTH_2 = """<link rel="stylesheet" href="../../vendor/bootstrap-4.3.1/css/bootstrap.min.css"/>
<link rel="stylesheet" type="text/css" href="../../vendor/bootstrap-table-1.19.0/extensions/filter-control/bootstrap-table-filter-control.min.css">
<script src="../../vendor/vega-5.33.1/vega.min.js"></script>
<script src="../../vendor/popper.js-1.12.9/umd/popper.min.js"></script>
<link rel="shortcut icon" href="../../static/images/favicon.ico" type="image/x-icon"/>
          <img
            class="NO-CACHE"
            src="../../static/images/logo-long.png"
            alt="Great Expectations"
          />
  .navbar-brand a {
    background: none 0 0 no-repeat;
  }
<p>Stay current <a href="https://greatexpectations.io/newsletter?utm_source=datadocs">Subscribe</a></p>
<script src="https://example.com/new-in-a-ge-upgrade.js" integrity="sha384-x" crossorigin="anonymous"></script>
"""  # noqa: E501


def test_cdn_assets_point_at_the_vendor_folder_relative_to_the_page_and_other_urls_stay() -> None:
    assert offline_html(PAGE, 2) == OFFLINE_AT_DEPTH_2


def test_a_page_at_the_site_root_gets_paths_without_parent_steps() -> None:
    assert offline_html('<script src="https://code.jquery.com/jquery-3.7.1.min.js"></script>', 0) == (
        '<script src="vendor/jquery-3.7.1/jquery.min.js"></script>'
    )


def test_paths_to_the_sites_static_folder_follow_the_page_depth() -> None:
    """GE's validation pages, five folders down, name their favicon four folders up."""
    page = '<link rel="shortcut icon" href="../../../../static/images/favicon.ico" type="image/x-icon"/>'
    assert offline_html(page, 5) == (
        '<link rel="shortcut icon" href="../../../../../static/images/favicon.ico" type="image/x-icon"/>'
    )


def test_rewriting_twice_changes_nothing() -> None:
    assert offline_html(OFFLINE_AT_DEPTH_2, 2) == OFFLINE_AT_DEPTH_2


def test_remote_assets_lists_scripts_styles_and_images_not_links_to_pages() -> None:
    page = (
        '<link rel="stylesheet" href="https://a.example/x.css"><link rel="canonical" href="https://a.example/">'
        '<img src="http://a.example/i.png"><a href="https://greatexpectations.io">GX</a>'
        '<script src="vendor/jquery-3.7.1/jquery.min.js"></script>'
    )
    assert remote_assets(page) == ["https://a.example/x.css", "http://a.example/i.png"]


def test_every_asset_is_vendored() -> None:
    assert sorted(p for p in set(ASSETS.values()) if not (VENDOR_DIR / p).is_file()) == []


def test_make_offline_copies_the_vendor_folder_and_rewrites_pages_and_stylesheets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site = tmp_path / "data_docs"
    (site / "expectations" / "shop").mkdir(parents=True)
    (site / "static" / "styles").mkdir(parents=True)
    vega = '<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>'
    (site / "index.html").write_text(vega)
    (site / "expectations" / "shop" / "orders.html").write_text(vega + '<img src="https://x.example/new.png">')
    logo = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/full_logo_dark.png"
    (site / "static" / "styles" / "gx.css").write_text(f"a {{ background: url('{logo}') }}")

    with caplog.at_level(logging.WARNING, logger="applier.validate.offline"):
        make_offline(site)

    assert (site / "index.html").read_text() == '<script src="vendor/vega-5.33.1/vega.min.js"></script>'
    assert (site / "expectations" / "shop" / "orders.html").read_text() == (
        '<script src="../../vendor/vega-5.33.1/vega.min.js"></script><img src="https://x.example/new.png">'
    )
    assert (site / "static" / "styles" / "gx.css").read_text() == "a { background: none }"
    copied = sorted(p.relative_to(site / "vendor") for p in (site / "vendor").rglob("*") if p.is_file())
    assert copied == sorted(p.relative_to(VENDOR_DIR) for p in VENDOR_DIR.rglob("*") if p.is_file())
    assert [r.getMessage() for r in caplog.records] == [
        "Data Docs: 1 remote asset(s) not vendored, e.g. https://x.example/new.png in expectations/shop/orders.html; "
        "offline, pages miss them (see applier/validate/vendor/README.md)"
    ]

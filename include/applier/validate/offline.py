"""Data Docs that open offline: their CDN styles, scripts and fonts served from the site itself.

GE's pages load bootstrap, jquery, bootstrap-table, font-awesome, vega and
the rest from public CDNs, and its logo from S3; offline, the index draws no
table of runs. The same files are vendored in this package (``vendor/``,
listed with versions and licenses in its README). After a build,
:func:`make_offline` copies them into the site as ``vendor/`` and rewrites
each page with :func:`offline_html`, which points every known CDN URL at that
folder by a path relative to the page, so the site also works when moved or
served under any prefix (behind a proxy, from the Airflow plugin).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

VENDOR_DIR = Path(__file__).with_name("vendor")
SITE_VENDOR = "vendor"

# CDN URL as GE's templates write it -> file under vendor/. The unminified
# .css GE names for two stylesheets get the package's minified build of it.
ASSETS: dict[str, str] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap-4.3.1/css/bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap-4.3.1/js/bootstrap.min.js",
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery-3.7.1/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.js-1.12.9/umd/popper.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker-1.9.0/css/bootstrap-datepicker.min.css"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker-1.9.0/js/bootstrap-datepicker.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        "bootstrap-table-1.19.1/bootstrap-table.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        "bootstrap-table-1.19.1/bootstrap-table.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "bootstrap-table-1.19.1/extensions/filter-control/bootstrap-table-filter-control.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "bootstrap-table-1.19.0/extensions/filter-control/bootstrap-table-filter-control.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        "bootstrap-table-1.19.0/extensions/filter-control/bootstrap-table-filter-control.min.css"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        "fontawesome-free-6.6.0/css/all.min.css"
    ),
    "https://cdn.jsdelivr.net/npm/vega@5": "vega-5.33.1/vega.min.js",
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite-5.23.0/vega-lite.min.js",
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed-6.29.0/vega-embed.min.js",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        "bootstrap-dark-1.1.0/css/bootstrap-prefers-dark.min.css"
    ),
}

_LOGOS = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"
# The navbar's logo (GE adds a cache-busting ?d=): GE writes the same image into the site.
_LOGO = re.compile(re.escape(_LOGOS) + r"logo-long\.png(?:\?[^\"']*)?")
_SITE_LOGO = "static/images/logo-long.png"
# GE's own files, in the site's static/: validation pages name the favicon one "../" short.
_SITE_STATIC = re.compile(r"(?:\./|(?:\.\./)*)(static/.*)")
# The dark theme draws a dark logo as the navbar link's background: dropped.
_DARK_LOGO = re.compile(r"url\((['\"]?)" + re.escape(_LOGOS) + r"full_logo_dark\.png\1\)")

_ASSET_TAG = re.compile(r"<(?:script|link|img)\b[^>]*>", re.IGNORECASE)
_URL_ATTRIBUTE = re.compile(r"""\b(src|href)=(["'])(.*?)\2""", re.IGNORECASE | re.DOTALL)
# A local file needs no subresource integrity, and crossorigin makes a browser
# refuse a script read from file://.
_CORS_ATTRIBUTES = re.compile(r"""\s+(?:integrity|crossorigin)(?:=(["']).*?\1)?""", re.IGNORECASE | re.DOTALL)


def offline_html(text: str, depth: int) -> str:
    """Point a Data Docs page's CDN assets at the site's vendored copies.

    Rewrites the ``src``/``href`` of ``<script>``, ``<link>`` and ``<img>``
    tags whose URL is in :data:`ASSETS` (dropping their ``integrity`` and
    ``crossorigin``), the GE logo to the site's copy, and drops the dark
    theme's background logo. Paths to GE's own ``static/`` folder are set
    to the page's depth (GE's validation pages name their favicon one
    folder short). Other URLs, such as links to greatexpectations.io, are
    left as they are. Works on a stylesheet too.

    Args:
        text: the page (or stylesheet) as GE wrote it.
        depth: how many folders below the site's root the page is
            (``index.html`` 0, ``expectations/shop/orders.html`` 2).

    Returns:
        The page with relative paths to the site's ``vendor/`` and ``static/``.
    """
    up = "../" * depth

    def local(url: str) -> str | None:
        if url in ASSETS:
            return f"{up}{SITE_VENDOR}/{ASSETS[url]}"
        if _LOGO.fullmatch(url):
            return f"{up}{_SITE_LOGO}"
        static = _SITE_STATIC.fullmatch(url)
        return f"{up}{static.group(1)}" if static else None

    def tag(match: re.Match[str]) -> str:
        rewritten = False

        def attribute(found: re.Match[str]) -> str:
            nonlocal rewritten
            path = local(found.group(3))
            if path is None:
                return found.group(0)
            rewritten = True
            return f"{found.group(1)}={found.group(2)}{path}{found.group(2)}"

        html = _URL_ATTRIBUTE.sub(attribute, match.group(0))
        return _CORS_ATTRIBUTES.sub("", html) if rewritten else html

    return _DARK_LOGO.sub("none", _ASSET_TAG.sub(tag, text))


def remote_assets(text: str) -> list[str]:
    """The http(s) URLs a page still loads scripts, stylesheets or images from (a GE upgrade's new ones)."""
    return [
        attribute.group(3)
        for tag in _ASSET_TAG.finditer(text)
        if _loads(tag.group(0))
        for attribute in _URL_ATTRIBUTE.finditer(tag.group(0))
        if re.match(r"https?://", attribute.group(3), re.IGNORECASE)
    ]


def _loads(tag: str) -> bool:
    """A script, an image, or a ``<link>`` to a stylesheet or an icon (other links load nothing)."""
    if not tag.lower().startswith("<link"):
        return True
    rel = re.search(r"""\brel=(["'])(.*?)\1""", tag, re.IGNORECASE)
    return rel is not None and re.search(r"stylesheet|icon", rel.group(2), re.IGNORECASE) is not None


def make_offline(site_dir: Path) -> None:
    """Copy the vendored assets into a freshly built site and rewrite its pages and stylesheets.

    Run once after each build (the build starts from an empty folder). A
    remote asset left in a page, one GE added in an upgrade, is logged once,
    naming the page: the page then needs the network for it.

    Args:
        site_dir: the Data Docs site's folder, holding ``index.html``.
    """
    shutil.copytree(VENDOR_DIR, site_dir / SITE_VENDOR, dirs_exist_ok=True)
    pages = [*site_dir.rglob("*.html"), *(site_dir / "static").rglob("*.css")]
    left: dict[str, Path] = {}
    for page in pages:
        relative = page.relative_to(site_dir)
        if relative.parts[0] == SITE_VENDOR:
            continue
        text = page.read_text(encoding="utf-8")
        rewritten = offline_html(text, len(relative.parts) - 1)
        if rewritten != text:
            page.write_text(rewritten, encoding="utf-8")
        left.update({url: relative for url in remote_assets(rewritten)})
    if left:
        url, page = next(iter(left.items()))
        log.warning(
            "Data Docs: %d remote asset(s) not vendored, e.g. %s in %s; offline, pages miss them "
            "(see applier/validate/vendor/README.md)",
            len(left),
            url,
            page,
        )

"""``scrapy genspider``, with webfarm's templates next to Scrapy's own.

``scrapy genspider -t site NAME DOMAIN`` writes ``spiders/NAME.py`` (a spider on
:class:`spiders.base.WebfarmSpider` with an item class, its key, an extraction stub and
a render mode) and, because a new site should start with a test, the files under
``TEMPLATES_DIR/tests/site/``: ``tests/test_site_NAME.py``, which runs the extraction
offline on ``tests/sites/NAME/page.html``. Templates are looked up in ``TEMPLATES_DIR``
first, then in Scrapy's (``-t basic`` and friends keep working).
"""

from __future__ import annotations

import argparse
import keyword
import re
import string
import sys
from pathlib import Path
from typing import Any

import scrapy
from scrapy.commands.genspider import Command as ScrapyGenspiderCommand
from scrapy.commands.genspider import sanitize_module_name
from scrapy.utils.conf import closest_scrapy_cfg

SCRAPY_TEMPLATES = Path(scrapy.__path__[0], "templates", "spiders")


def module_name_problem(name: str) -> str | None:
    """Why ``name`` cannot give a spider module and classes, or None. Scrapy's genspider
    writes any name: ``my shop`` gave ``spiders/my shop.py`` with ``class My shopSpider``,
    a SyntaxError that stopped every command of the project (the spider loader imports
    each module), and ``class`` gave a module its test cannot import."""
    module = sanitize_module_name(name) if name else ""
    if not module.isidentifier():
        return ("use letters, digits, _ and - (e.g. "
                f"{re.sub(r'[^0-9A-Za-z_-]+', '_', name).strip('_') or 'my_site'})")
    if keyword.iskeyword(module):
        return f"{module!r} is a Python keyword, which no module may be named; e.g. {module}_site"
    return None


class Command(ScrapyGenspiderCommand):
    def short_desc(self) -> str:
        return "Generate a new spider (-t site: a webfarm site spider and its offline test)"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        self._force = bool(opts.force)
        if len(args) == 2 and not opts.list and not opts.dump:
            why = module_name_problem(args[0])
            if why:
                print(f"webfarm: cannot name a spider {args[0]!r}: {why}", file=sys.stderr)
                self.exitcode = 2
                return
        super().run(args, opts)

    def _template_dirs(self) -> list[Path]:
        dirs = [Path(self.templates_dir)]
        return dirs + [SCRAPY_TEMPLATES] if SCRAPY_TEMPLATES not in dirs else dirs

    def _find_template(self, template: str) -> Path | None:
        filename = template if template.endswith(".tmpl") else f"{template}.tmpl"
        for path in (Path(filename), *(d / filename for d in self._template_dirs())):
            if path.exists():
                return path
        print(f"Unable to find template: {template}\n"
              'Use "scrapy genspider --list" to see all available templates.')
        return None

    def _list_templates(self) -> None:
        names = sorted({f.stem for d in self._template_dirs() if d.is_dir()
                        for f in d.iterdir() if f.suffix == ".tmpl"})
        print("Available templates:\n" + "\n".join(f"  {n}" for n in names))

    def _generate_template_variables(self, module: str, name: str, url: str,
                                      template_name: str) -> dict[str, Any]:
        tvars = super()._generate_template_variables(module, name, url, template_name)
        base = tvars["classname"].removesuffix("Spider")
        tvars["itemclass"] = f"{base}Item"
        tvars["collection"] = f"{module}_items"
        return tvars

    def _genspider(self, module: str, name: str, url: str, template_name: str,
                   template_file: str | Path) -> Path:
        spider_file = super()._genspider(module, name, url, template_name, template_file)
        companions = Path(self.templates_dir).parent / "tests" / Path(template_name).stem
        if companions.is_dir():
            tvars = self._generate_template_variables(module, name, url, template_name)
            self._write_tests(companions, tvars)
        return spider_file

    def _write_tests(self, source: Path, tvars: dict[str, Any]) -> None:
        """Render every ``*.tmpl`` under ``source`` into the project's ``tests/``
        (``${module}`` in a path becomes the spider's module name)."""
        cfg = closest_scrapy_cfg()
        root = Path(cfg).parent if cfg else Path.cwd()
        tests = root / "tests"
        for template in sorted(source.rglob("*.tmpl")):
            relative = string.Template(str(template.relative_to(source))).substitute(tvars)
            target = tests / relative.removesuffix(".tmpl")
            if target.exists() and not self._force:
                print(f"{target} already exists (--force overwrites it)")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            text = string.Template(template.read_text(encoding="utf-8")).substitute(tvars)
            target.write_text(text, encoding="utf-8")
            print(f"Created {target.relative_to(root)}")

"""The calculators on the built pages (docs/assets/calculator.js) against their Python side.

One test per calculator: tests/fixtures/calculators/NAME.json holds inputs and the Python outputs;
typed into the form on the page, every vector must show the same outputs, exactly (same
operations, same order, IEEE doubles), and every preset must fill the form with its values. A
planted wrong formula must be caught by the same check, and the forms start after an instant
navigation too.
"""

from __future__ import annotations

import pytest

from snippets.common import calculator as calc
from tests.e2e import checks

pytestmark = pytest.mark.browser

CHECK = (checks.JS / "calculator.js").read_text(encoding="utf-8")
PAGES = {f.argument: f"posts/{page.stem}/" for page, f in calc.declared(checks.ROOT)}
# A wrong formula a contributor could write: the quantized cache without its scales' bytes.
PLANT = ("return bits / 8 + (group ? scaleBytes / group : 0);", "return bits / 8;")


def check_calculator(page, name: str) -> list[str]:
    return page.evaluate(CHECK, {"name": name, "stored": calc.load_stored(name)})


@pytest.mark.parametrize("name", list(PAGES))
def test_calculator_shows_the_python_outputs_for_every_vector(visitor, name):
    page, guard = visitor.open(PAGES[name])
    try:
        problems = check_calculator(page, name)
        if problems:
            visitor.screenshot(page, f"calculator-{name}.png")
        problems += guard.console_problems() + guard.network_problems()
    finally:
        page.close()
    n = len(calc.load_stored(name)["vectors"])
    assert not problems, f"{PAGES[name]} calculator {name} ({n} vectors):\n" + "\n".join(
        problems[:10]
    )


def test_a_planted_wrong_formula_is_caught(visitor):
    """calculator.js served with the KV formula forgetting the scale bytes: the check reports
    the vectors of grouped formats on kv-cache, and only those, while the other forms pass."""

    def plant(route):
        body = route.fetch().text()
        assert PLANT[0] in body, "the planted line is gone from calculator.js: update PLANT"
        route.fulfill(body=body.replace(PLANT[0], PLANT[1]), content_type="text/javascript")

    page = visitor.context("light").new_page()
    guard = checks.Guard(page)
    page.route("**/assets/calculator.js*", plant)  # registered last: matched first
    try:
        page.goto(visitor.url(PAGES["kv-cache"]))
        checks.wait_ready(page)
        problems = check_calculator(page, "kv-cache")
        assert not guard.console_problems()
    finally:
        page.close()
    grouped = [i for i, v in enumerate(calc.load_stored("kv-cache")["vectors"])
               if v["input"]["group"]]  # fmt: skip
    assert problems, "the planted formula was missed"
    assert all(p.startswith("vector ") for p in problems), "\n".join(problems[:10])
    caught = {int(p.split(":")[0].removeprefix("vector ")) for p in problems}
    assert caught == set(grouped), "\n".join(problems[:10])


def test_calculators_start_after_an_instant_navigation(visitor):
    page, guard = visitor.open("")
    try:
        target = PAGES["kv-cache"]
        assert not checks.navigate_instantly(page, visitor.url(target))
        checks.wait_ready(page)
        shown = page.evaluate(
            """() => [...document.querySelectorAll("form[data-calculator] output")]
                     .map((o) => o.value)"""
        )
        problems = guard.console_problems()
    finally:
        page.close()
    assert shown and "—" not in shown, f"{target}: outputs after instant navigation: {shown}"
    assert not problems, problems

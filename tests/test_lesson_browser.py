"""The lesson page in a real browser: headless Chromium driven through selenium.

Needs Debian's `chromium` and `chromium-driver` and the `selenium` package (in the `test` extra);
without them the whole module is skipped with one line saying how to install them. Chromium is
started offline (no first run, sync, component updates or background networking) and selenium is
given both binaries, so nothing is downloaded.
"""

import shutil
import tempfile

import pytest
from test_lesson import LESSON, NOTES_NUMBERS, OPS_IN_CH11, small_graph

from autograd.viz import to_html

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
CHROMEDRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None
if webdriver is None or CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "browser tests skipped: they need Chromium, chromedriver and selenium; install them "
        "with `apt-get install -y chromium chromium-driver` (Debian, as root) and "
        "`pip install -e .[test]`",
        allow_module_level=True,
    )

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
]


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="glassgrad-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Both paths given, so selenium never runs Selenium Manager (which would download a driver).
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, path=LESSON, step=None):
    driver.get("about:blank")  # a real load each time, not only a change of #step
    driver.get(path.as_uri() + ("" if step is None else f"#step={step}"))
    driver.get_log("browser")  # start each test with an empty console
    return driver


def state(driver):
    """(step shown, highlighted node id, visible panel text, address hash)."""
    return driver.execute_script(
        """
        const shown = [...document.querySelectorAll("section.step")].filter((s) => !s.hidden);
        const current = [...document.querySelectorAll("#graph .node.current")];
        return [shown.map((s) => Number(s.dataset.step)), current.map((n) => n.id),
                document.getElementById("panel").innerText, location.hash];
        """
    )


def press(driver, key):
    ActionChains(driver).send_keys(key).perform()


def console_errors(driver):
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_page_loads_without_console_errors(browser):
    driver = browser
    driver.get(LESSON.as_uri())
    assert console_errors(driver) == []
    assert driver.find_element("id", "counter").text == "step 0 of 32 \u00b7 start"


def test_browser_sees_one_graph_node_per_op(browser):
    driver = open_page(browser)
    ops_drawn = driver.find_elements("css selector", "#graph .node.op")
    assert len(ops_drawn) == OPS_IN_CH11
    steps = driver.find_elements("css selector", "section.step.forward")
    assert {s.get_attribute("data-node") for s in steps} == {
        n.get_attribute("id") for n in ops_drawn
    }


def test_arrow_keys_move_the_highlight_and_the_panel(browser):
    driver = open_page(browser, step=5)
    shown, node, text, where = state(driver)
    press(driver, Keys.ARROW_RIGHT)
    after = state(driver)
    assert after[0] == [6] and after[3] == "#step=6"
    assert len(after[1]) == 1 and after[1] != node and after[2] != text
    press(driver, Keys.ARROW_LEFT)
    assert state(driver) == [shown, node, text, where]
    driver.find_element("id", "next").click()
    assert state(driver)[0] == [6]
    driver.find_element("id", "prev").click()
    assert state(driver)[0] == [5]
    assert console_errors(driver) == []


def test_step_in_the_address_opens_that_step(browser):
    driver = open_page(browser, step=19)
    shown, node, text, _ = state(driver)
    assert shown == [19] and text.startswith("Backward 4 of 15: Add \u2192 R")
    section = driver.find_element("id", "step-19")
    assert node == [section.get_attribute("data-node")]
    driver.execute_script("location.hash = '#step=2'")
    assert state(driver)[0] == [2]
    assert open_page(driver, step=999).find_element("id", "step-32").is_displayed()


def test_the_notes_numbers_appear_when_stepping_through(browser):
    driver = open_page(browser, step=0)
    seen = []
    for _ in range(33):
        seen.append(state(driver)[2])
        press(driver, Keys.ARROW_RIGHT)
    assert state(driver)[0] == [32]  # the last step stays
    everything = "\n".join(seen)
    missing = [name for name, number in NOTES_NUMBERS.items() if number not in everything]
    assert missing == [], f"not shown on any step: {missing}"
    assert console_errors(driver) == []


def test_clicking_a_formula_copies_its_latex(browser):
    driver = open_page(browser, step=14)
    formula = driver.find_element("css selector", "#step-14 .formula")
    formula.click()
    # the message fades in (and the clipboard answers asynchronously): read it once it is there
    said = WebDriverWait(driver, 5).until(
        lambda d: d.find_element("id", "status").get_attribute("textContent")
    )
    assert said == "LaTeX copied: " + formula.get_attribute("data-latex")
    assert console_errors(driver) == []


def test_labels_fit_their_boxes_and_boxes_do_not_overlap_at_1280x800(browser):
    driver = open_page(browser, step=0)
    boxes, texts = driver.execute_script(
        """
        const rect = (e) => { const r = e.getBoundingClientRect();
                              return [r.left, r.top, r.right, r.bottom]; };
        const nodes = [...document.querySelectorAll("#graph .node")];
        return [nodes.map((n) => rect(n.querySelector("rect"))),
                nodes.map((n) => [...n.querySelectorAll("text")].map(rect))];
        """
    )
    for i, (left, top, right, bottom) in enumerate(boxes):
        for t_left, t_top, t_right, t_bottom in texts[i]:
            assert left <= t_left and t_right <= right and top <= t_top and t_bottom <= bottom
        for other in boxes[i + 1 :]:
            apart = right <= other[0] or other[2] <= left or bottom <= other[1] or other[3] <= top
            assert apart, (boxes[i], other)
    # The whole graph is visible beside the panel without scrolling.
    pane = driver.execute_script(
        "const p = document.getElementById('graph-pane');"
        "return [p.scrollWidth <= p.clientWidth, p.scrollHeight <= p.clientHeight];"
    )
    assert pane == [True, True]


def test_a_page_from_to_html_works_in_the_browser(browser, tmp_path):
    path = to_html(small_graph()[-1], tmp_path / "small.html")
    driver = open_page(browser, path, step=0)
    assert len(driver.find_elements("css selector", "#graph .node.op")) == 5
    press(driver, Keys.END)
    assert state(driver)[2].startswith("The leaves' gradients")
    assert console_errors(driver) == []


# --- the language switch: the notes' Chinese wording beside the English ------------------------


def visible(driver, selector):
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".filter((e) => e.offsetParent !== null).map((e) => e.innerText);",
        selector,
    )


def test_the_switch_shows_each_step_in_chinese_and_back(browser):
    driver = open_page(browser, step=0)
    assert driver.execute_script("return document.documentElement.dataset.ui") == "en"
    driver.find_element("id", "lang-zh").click()
    shown, _, text, where = state(driver)
    assert shown == [0] and where == "#step=0&lang=zh"
    assert driver.find_element("id", "counter").text == "第 0 步，共 32 步 \u00b7 开始"
    assert text.startswith("计算图：15 个运算，8 个叶子")
    assert "笔记原文，11.1" in text and "为了把数值算到底" in text
    assert "The graph:" not in text and "To carry the numbers" not in text
    assert driver.title == "笔记第 11 章，逐个运算：前向、反向、一次更新"
    assert driver.find_element("id", "next").text == "下一步 \u2192"
    driver.find_element("id", "lang-en").click()
    shown, _, text, where = state(driver)
    assert where == "#step=0" and text.startswith("The graph: 15 ops, 8 leaves")
    assert "The notes, 11.1" in text and "为了" not in text
    assert console_errors(driver) == []


def test_lang_in_the_address_opens_that_language(browser):
    driver = browser
    driver.get("about:blank")
    driver.get(LESSON.as_uri() + "#step=19&lang=zh")
    shown, _, text, _ = state(driver)
    assert shown == [19] and text.startswith("反向 4/15：Add \u2192 R")
    press(driver, Keys.ARROW_RIGHT)  # the language stays while stepping
    assert state(driver)[3] == "#step=20&lang=zh"


def test_both_languages_show_the_same_numbers_and_formulas_on_every_step(browser):
    """Numbers and formulas are shared: the <pre> values and formulas of each step are the same
    in both languages; every step has its heading in each language and the notes' numbers appear
    in Chinese too; the notes' own words are on the 12 steps that quote them."""
    driver = open_page(browser, step=0)
    seen = {"en": [], "zh": []}
    quoted = 0
    for lang in ("en", "zh"):
        driver.find_element("id", f"lang-{lang}").click()
        press(driver, Keys.HOME)
        for i in range(33):
            section = f"#step-{i}"
            values = visible(driver, f"{section} pre") + visible(driver, f"{section} .formula code")
            heading = visible(driver, f"{section} h2")[0]
            seen[lang].append((values, state(driver)[2]))
            has_cjk = any("\u4e00" <= ch <= "\u9fff" for ch in heading)
            assert has_cjk == (lang == "zh"), (lang, i, heading)
            if lang == "zh":
                quoted += len(visible(driver, f"{section} blockquote.notes"))
            press(driver, Keys.ARROW_RIGHT)
    assert [v for v, _ in seen["en"]] == [v for v, _ in seen["zh"]]
    everything = "\n".join(text for _, text in seen["zh"])
    missing = [name for name, number in NOTES_NUMBERS.items() if number not in everything]
    assert missing == [] and quoted == 12
    assert "这正是原问答中缺少的中间桥梁" in everything
    assert console_errors(driver) == []

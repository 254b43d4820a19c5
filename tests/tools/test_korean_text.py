"""tools/korean_text.py: the constitution's preamble and articles, one a line, the headings and addenda left out,
read from konlpy's wheel as a zip entry (never imported); a missing wheel is one sentence, exit 2, nothing written."""

from test_gguf_lm import write_wheel

from tools import korean_text

TEXT = (
    "대한민국헌법\n\n서문 첫째 줄\n 둘째 줄.\n\n  제1장 총강\n  제1조 ① 첫 조항.\n②둘째 항.\n"
    "  제2조의2 다른 조항.\n부칙\n제1조 시행일.\n"
)


def test_articles_are_the_preamble_and_each_article():
    assert korean_text.articles(TEXT) == ["서문 첫째 줄 둘째 줄.", "제1조 ① 첫 조항. ②둘째 항.", "제2조의2 다른 조항."]


def test_the_text_is_written_from_the_wheel(tmp_path, monkeypatch):
    part = korean_text.CONSTITUTION
    body = "대한민국헌법\n" + "".join(f"  제{i}조 조항 {i}.\n" for i in range(1, 131))
    write_wheel(tmp_path, part.requirement, {part.member: body.encode()})
    out = tmp_path / "texts" / "ko.txt"
    assert korean_text.main(["--out", str(out), "--downloads", str(tmp_path)]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == [f"제{i}조 조항 {i}." for i in range(1, 131)]


def test_a_missing_wheel_is_one_sentence_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "texts" / "ko.txt"
    assert korean_text.main(["--out", str(out), "--downloads", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "konlpy==0.6.0" in err
    assert not out.exists()


def test_a_file_not_in_utf8_is_one_sentence_and_nothing_written(tmp_path, capsys):
    part = korean_text.CONSTITUTION
    body = "대한민국헌법\n" + "".join(f"  제{i}조 조항 {i}.\n" for i in range(1, 131))
    write_wheel(tmp_path, part.requirement, {part.member: body.encode("euc-kr")})
    out = tmp_path / "texts" / "ko.txt"
    assert korean_text.main(["--out", str(out), "--downloads", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "not UTF-8" in err
    assert not out.exists()

"""What the text around a number says it is, for the `pii` step: a version rather than an IPv4
address, a phone number whatever its area code.

A dotted quad such as 4.3.0.1 is a valid public address and a common four-part version; it is a
version when the text marks it as one:
- a version word close before it (`version`, `Standards-Version to`, `upgrade to`, `v`), or a
  version constraint (`(>= 3.5.30.1)`, `foo==1.2.3.4`);
- a name assigned to, ending in `version` (`__version__ = "..."`, `"version": "..."`, `APP_VERSION=`,
  `AssemblyVersion("...")`, `<version>`);
- right after a product's name, not a networking or log word (`Server`, `Host`, `From`, `Blocked`,
  ...): one written with an inner capital or a digit (`XFree86`, `OpenSSL`, `Qt5`), one with a
  capital initial (`Python`) before a version-like number (its last three parts under 100), or any
  name glued to it with a dash (`linux-4.3.0.1`);
- a changelog heading: `Changes in`, `What's new in` (and an optional name) at the start of the line,
  or a heading mark (`#`, `=`) before it and only a date after it (`## 1.2.3.4 - 2020-01-01`), or a
  `##`/`==` mark and nothing after it;
- a section word or sign before it (`section`, `§`, `Table`, `Sección`, `в разделе`, `第`, `セクション`) or a
  section mark after it (`节`, `절`, Hungarian `pont`), a Debian package header (`xft (2.3.2.1-7)`), or a
  revision after it (`-7)`, `-1ubuntu1`, `+dfsg`, `~rc1`; not a range's end, `-40`).
Version, section and phone words are listed for English and the 24 languages of
kiln.curate.steps.pii.regions (fr de es it pt nl pl ru uk id vi tr cs sv ro hu el ar fa hi zh ja ko th).
Names in lower case (`host`, `web-01`) and in capitals (`IP`, `PING`) are no product's: an address
after one stays an address. A phone word right before a number of phone shape (`Phone:`, `mobile`,
`tel:`, `call me at`, `Teléfono:`, `电话：`, `โทร`) makes it a phone even where libphonenumber knows no
such area or range.
Not handled: a version alone on its line with no heading mark (`3.3.91` followed by a list), a
product's name in capitals (`GCC 4.1.2.1`) or lower case (`gcc 4.1.2.1`), a phone word after the
number (`968-909-5111 (cell)`), words of other languages, and inflected forms not listed.
"""

from __future__ import annotations

import re

# Every rule reads at most this many characters of the line before the number (or after it, for a
# heading's date), so a long line full of numbers costs linear time.
CONTEXT_CHARS = 64

# A version word, then at most three linking words or version-like tokens (Standards-Version to ...,
# upgrade from 1.2.3.4 to ...). The word "version" of other languages (es it pt nl pl ru uk tr cs hu ro el vi
# hi fa ar; then zh ja ko th, written without spaces) counts as it does.
_VERSION_BEFORE = re.compile(
    r"(?i)(?:\b(?:versions?|releases?|released|upstream|updated?|updates|upgraded?|upgrades|bump(?:ed|s)?|firmware"
    r"|build|ver|v|rev|revision|kernel|patch(?:ed)?"
    r"|versi[oó]n|versione|vers[aã]o|versie|wersj[ai]|верси[яию]|версі[яїю]|s[uü]r[uü]m\w*|verz[ie]\w*|versiunea"
    r"|[eέ]κδοσ[ηe]|phi[eê]n\s?b[aả]n|संस्करण|نسخه|(?:ال)?إصدار)\b|版本|バージョン|버전|เวอร์ชัน)"
    r"(?:[\s:=#,]+(?:to|is|was|of|at|now|number|no\.?|string|\d[\w.+~-]*)){0,3}[\s:=#,(]*\Z"
    # a version constraint: (>= 3.5.30.1), foo==1.2.3.4, (< 2.0.0.1); `ip.addr == 1.2.3.4` is a filter, not one
    r"|(?:[<>~]=|\w[=!]=|>>|<<|\([ \t]*[<>=])[ \t]*\Z"
)
# A name ending in "version" and an assignment: the name may be snake, camel or upper case
# (__version__, appVersion, APP_VERSION_STRING), so "conversion" is not one; quoted as a JSON or
# YAML key, called (AssemblyVersion("), or an XML element.
_VERSION_ASSIGNED = re.compile(
    r"(?:(?<![A-Za-z])(?i:version)|(?<=[a-z])Version)(?:_?(?i:string|str|number|num|name|info|code|id|tag))?_{0,2}"
    r"[\"']?[ \t]{0,3}(?::=|=>|==|[:=(>])[ \t]{0,3}[\"'(]?\Z"
)
# Section words of the languages kiln curates (a cross-reference such as "Sección 6.2.1.2", "Abschnitt 3.4.1.2" or
# "в разделе 1.2.3.4" is not an address), inflected forms by their stem where the language declines them; then
# the words and marks of scripts written without spaces, which need no word start: 第 before a section number and
# 节/節/章/条/條/절/장/조 after it ("第 4.6.1.2 节"), 表/图/図/セクション/섹션/ส่วนที่ before it.
_SECTION_WORDS = (
    "section|sect|sec|chapter|chap|clause|paragraph|para|figure|fig|table|tab|appendix|annex|article|art|"
    "exercise|equation|eq|lemma|theorem|definition|listing|"
    "secci[oó]n|cap[ií]tulo|apartado|art[ií]culo|tabla|figura|anexo|p[aá]rrafo|"  # es (pt and it share some)
    "chapitre|paragraphe|tableau|annexe|"  # fr
    "abschnitt|abschn|kapitel|absatz|tabelle|abbildung|abb|anhang|artikel|ziffer|"  # de
    "sezione|capitolo|paragrafo|articolo|tabella|allegato|"  # it
    "se[cç][aã]o|artigo|tabela|"  # pt
    "sectie|hoofdstuk|paragraaf|tabel|figuur|bijlage|"  # nl
    r"sekcj\w*|rozdzia[lł]\w*|punk[tc]\w*|artyku[lł]\w*|tabel[ia]|rysun\w*|za[lł][aą]cznik\w*|"  # pl
    r"раздел\w*|глав[аеуы]|пункт\w*|стать[яиеюй]|таблиц\w*|рисун\w*|приложени\w*|параграф\w*|"  # ru
    r"розділ\w*|статт[яіею]|додат\w*|малюн\w*|"  # uk (пункт, таблиця, рисунок, глава as ru)
    r"b[oö]l[uü]m\w*|madde\w*|tablo\w*|[sş]ekil\w*|"  # tr
    "bagian|bab|pasal|gambar|lampiran|ayat|"  # id
    "m[uụ]c|ch[uư][oơ]ng|[dđ]i[eề]u|b[aả]ng|h[iì]nh|ph[aầ]n|"  # vi
    r"odd[ií]l\w*|kapitol\w*|[cč]l[aá]n(?:ek|ku)|tabul[kc]\w*|obr[aá]z\w*|obr|p[rř][ií]loh\w*|odstav\w*|"  # cs
    r"č[aá]st\w*|"  # cs
    r"avsnitt\w*|kapitlet|tabell\w*|figur\w*|bilag\w*|"  # sv
    r"sec[țţt]iun\w*|capitolul\w*|articolul\w*|tabelul\w*|anex\w*|punctul\w*|paragraful\w*|"  # ro
    r"szakasz\w*|fejezet\w*|t[aá]bl[aá]zat\w*|[aá]br[aá]\w*|mell[eé]klet\w*|"  # hu
    r"εν[οό]τητ\w*|κεφ[αά]λαι\w*|[αά]ρθρ\w*|παρ[αά]γραφ\w*|π[ιί]νακ\w*|σχ[ηή]μα\w*|παρ[αά]ρτημα\w*|τμ[ηή]μα\w*|"  # el
    "(?:ال)?(?:قسم|فصل|بند|مادة|جدول|شكل|فقرة|ملحق)|"  # ar, with or without its article
    "بخش|ماده|شکل|پیوست|قسمت|"  # fa (فصل, بند, جدول as ar)
    "खंड|खण्ड|अनुभाग|अध्याय|धारा|तालिका|चित्र|परिशिष्ट|अनुच्छेद"  # hi
)
_SECTION_MARKS = (
    "§§?|[第表图図圖]|章节|章節|小节|小節|附录|附錄|付録|セクション|그림|표|섹션|부록|"
    "(?:หัวข้อ|ส่วน|มาตรา|ตาราง|รูป|บท)(?:ที่)?"  # th
)
_SECTION_BEFORE = re.compile(rf"(?i)(?:\b(?:{_SECTION_WORDS})\.?|{_SECTION_MARKS})\s*\Z")
# After the number: the CJK marks, and the words Hungarian and Turkish write after it ("a 3.4.1.2. pontban").
_SECTION_AFTER = re.compile(
    r"\s*[节節章条條项項款절장조항]|\.?[ \t](?i:pont|fejezet|szakasz|bekezd[eé]s|t[aá]bl[aá]zat|[aá]br[aá]|madde)"
)
_PACKAGE_HEADER = re.compile(r"[a-z0-9][a-z0-9+.-]* \(\Z")  # from the start of the line
# A revision is glued to what follows it or closes a parenthesis (1.2.3.4-7), 1.2.3.4-1ubuntu1), unlike
# the end of an address range (93.184.216.34-40).
_REVISION_AFTER = re.compile(r"-\d+(?=\)|[A-Za-z+~])|[+~][A-Za-z0-9]")

# The name right before the number, after one space or glued by a dash (a dash inside a name too:
# at-spi2-core). It starts where a word starts: not inside a host name, path, address or option.
_NAME_BEFORE = re.compile(r"(?<![\w.@/:+-])(?P<name>[A-Za-z][A-Za-z0-9+]*(?:[-_][A-Za-z0-9+]+)*)(?P<glue> |-)\Z")
# Words that say what an address is or what is done to it: after one, even capitalized at the start of
# a line (`Server 93.184.216.34 refused`, `Add 93.184.216.34 to ...`), a dotted quad is an address.
# Compared in lower case, part by part (`Next-Hop`), without trailing digits (`Server2`); verb forms in
# -ed and -ing (`Blocked`, `Trying`) are never a product's name either.
_NETWORK_WORDS = frozenset(
    "ip ips ipv ipaddr addr address addresses host hosts hostname server servers nameserver nameservers dns resolver "
    "client clients peer peers proxy gateway gw router route hop node remote local public private external internal "
    "src source dst dest destination from to via by at for on origin target inet listen bind mirror user visitor "
    "attacker device machine login ssh telnet ping trace traceroute connect connection reply request query lookup "
    "whois scan probe add remove set use allow block ban unban deny reject drop accept forward redirect assign lease "
    "whitelist blacklist allowlist blocklist firewall".split()
)

# A changelog heading's start: a heading mark, `Changes in` or `What's new in` and a name, a version word.
_HEADING_BEFORE = re.compile(
    r"(?i)[ \t]{0,3}(?P<mark>#{1,6}|={1,6})?[ \t]{0,3}\[?"
    r"(?P<words>(?:(?:changes|changelog|release[ \t]+notes)(?:[ \t]+(?:in|for|since))?"
    r"|(?:what['’]?s[ \t]+)?new[ \t]+in|news[ \t]+for)"
    r"[ \t:]{1,3}(?:[A-Za-z][\w+-]*[ \t]{1,3})?)?(?:v|version[ \t]+|release[ \t]+)?"
)
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]{0,6}\.?"
_DATE = (
    rf"(?:\d{{4}}[-/]\d{{2}}[-/]\d{{2}}|\d{{1,2}}(?:st|nd|rd|th)?[ \t]{_MONTH}[ \t,]{{1,2}}\d{{4}}"
    rf"|{_MONTH}[ \t]\d{{1,2}}(?:st|nd|rd|th)?,?[ \t]\d{{4}})"
)
# What may follow a heading's version to the end of the line: a date alone (a log line has a time or
# more after its date), or nothing but a closing mark.
_HEADING_DATE_AFTER = re.compile(
    rf"(?i)\]?[ \t]{{0,3}}(?:[-–—:,][ \t]{{0,3}})?[(\[]?(?:released[ \t])?{_DATE}[)\]]?[ \t]{{0,3}}"
)
_HEADING_BARE_AFTER = re.compile(r"\]?:?[ \t]{0,3}=*[ \t]{0,3}")


def ipv4_is_version(text: str, start: int, end: int) -> bool:
    """Whether the text marks the dotted quad at text[start:end] as a version or a section number."""
    # subtle: rfind bounded to the context, so one long line of addresses is not scanned back once per
    # address (1 s per MB of them). The rules search text[lo:start] in place rather than a slice of it:
    # a word cut by the window's edge (release_|version=) is then not read as a word.
    newline = text.rfind("\n", max(0, start - CONTEXT_CHARS - 1), start)
    lo = newline + 1 if newline >= 0 else max(0, start - CONTEXT_CHARS)
    at_line_start = newline >= 0 or start <= CONTEXT_CHARS  # text[lo:start] is all the line before the number
    if any(rule.search(text, lo, start) for rule in (_VERSION_BEFORE, _SECTION_BEFORE, _VERSION_ASSIGNED)):
        return True
    if _REVISION_AFTER.match(text, end) or _SECTION_AFTER.match(text, end):
        return True
    name = _NAME_BEFORE.search(text, lo, start)
    if name is not None and _product_name(name["name"], name["glue"], text[start:end]):
        return True
    if not at_line_start:
        return False
    return _PACKAGE_HEADER.fullmatch(text, lo, start) is not None or _changelog_heading(text, lo, start, end)


def _product_name(name: str, glue: str, quad: str) -> bool:
    """Whether a name right before the dotted quad names a product (`XFree86`, `linux-`, `Python` before a
    version-like number), not a network role."""
    lower = name.lower()
    if lower.endswith(("ed", "ing")):
        return False
    if any(part.rstrip("0123456789") in _NETWORK_WORDS for part in re.split(r"[-_]", lower)):
        return False
    if glue == "-":
        return True
    # Lower case is how host names and log verbs are written, capitals how protocols are (IP, PING).
    if name == lower or not any(c.islower() for c in name):
        return False
    if any(c.isupper() for c in name[1:]) or any(c.isdigit() for c in name):
        return True  # XFree86, OpenSSL, Qt5: no sentence starts so
    # subtle: a capital initial alone also starts sentences (`See 93.184.216.34`); then the number must
    # read as a version too: its last three parts under 100 (3.11.7.1), as 6% of random addresses are.
    return all(int(part) < 100 for part in quad.split(".")[1:])


def _changelog_heading(text: str, line_start: int, start: int, end: int) -> bool:
    head = _HEADING_BEFORE.fullmatch(text, line_start, start)
    if head is None:
        return False
    if head["words"]:
        return True
    if head["mark"] is None:
        return False  # a bare dotted quad at the start of a line is as often one of a list of addresses
    stop = text.find("\n", end, end + CONTEXT_CHARS)
    after = text[end : stop if stop >= 0 else end + CONTEXT_CHARS]
    if _HEADING_DATE_AFTER.fullmatch(after):
        return True
    # `# 93.184.216.34` alone is as often a comment in a shell script or a hosts file as a heading.
    return head["mark"] != "#" and _HEADING_BARE_AFTER.fullmatch(after) is not None


# A phone word, then at most two linking words (`number`, `no.`, `me at`, `de contacto`), then punctuation: right
# before the number. A word of a spaced script starts where a word starts (not `Hotel`); those of scripts written
# without spaces (电话, 電話番号, โทรศัพท์) need not. A suffix may be glued to it (Telefonnummer, 전화번호).
_PHONE_WORDS = (
    "phones?|telephone|tel|mobile|mob|cell(?:phone)?|fax|call|ph|whatsapp|"  # en, and tel, mob, fax in many
    "tel[eé]fono|m[oó]vil|celular|tfno|tlf|"  # es
    "t[eé]l[eé]phone|t[eé]l|portable|"  # fr
    "telefon|handy|mobil(?:telefon)?|rufnummer|festnetz|"  # de; telefon, mobil also pl cs sv ro hu tr
    "telefono|cellulare|telefone|telem[oó]vel|"  # it pt
    r"telefoon|mobiel|gsm|kom[oó]rk\w*|"  # nl pl
    r"телефон|тел|моб|мобильн\w*|мобільн\w*|сотов\w*|факс|"  # ru uk
    "telepon|telp|ponsel|"  # id
    r"điện\s?thoại|đt|sđt|đtdđ|di\s?động|"  # vi
    "cep|faks|"  # tr
    "τηλ[εέ]φωνο|τηλ|κινητ[οό]|φαξ|"  # el
    "(?:ال)?(?:هاتف|جوال|تلفون|موبايل|فاكس)|"  # ar, with or without its article
    "تلفن|موبایل|فکس|"  # fa
    "(?:फ\u093c?|\u095e)ोन|मोबाइल|दूरभाष|टेली(?:फ\u093c?|\u095e)ोन"  # hi, फ़ with its nukta composed or not
)
_PHONE_WORDS_UNSPACED = "电话|電話|手机|手機|传真|傳真|携帯|ファックス|전화|휴대폰|핸드폰|팩스|โทร(?:ศัพท์)?|มือถือ|แฟกซ์"
_PHONE_WORD_GLUED = "番号|号码|號碼|번호|nummer|nr|sz[aá]m|หมายเลข"
_PHONE_LINKING = (
    r"number|no\.?|nr\.?|me|us|at|on|n[uú]mero|num[eé]ro|nummer|numer|номер[ау]?|numaras[ıi]|[cč][ií]slo|"
    r"sz[aá]m|αριθμ[οό]ς|s[oố]|nomor|de|contacto|contato|fijo|kom\.?|번호|หมายเลข|नंबर|رقم|شماره|همراه"
)
_PHONE_WORD_BEFORE = re.compile(
    rf"(?i)(?:(?<![\w-])(?:{_PHONE_WORDS})|{_PHONE_WORDS_UNSPACED})(?:{_PHONE_WORD_GLUED})?"
    rf"(?:[ \t]{{1,2}}(?:{_PHONE_LINKING})){{0,2}}[\s.:;,=#/\"'(：-]{{0,4}}\Z"
)
_PHONE_WORD_CHARS = 40


def after_phone_word(text: str, start: int) -> bool:
    """Whether a phone word stands right before text[start:] (`Phone: `, `mobile `, `tel:`, `call me at `)."""
    return _PHONE_WORD_BEFORE.search(text, max(0, start - _PHONE_WORD_CHARS), start) is not None

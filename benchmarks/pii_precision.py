"""Recall and precision of the curate `pii` step on labelled cases, and its speed on local text.

Cases are written here, at least 30 per kind of personal data and 30 look-alikes per kind:
a positive case marks its value as [[value]] and is right when the step's output is the text with
exactly that value replaced by the kind's placeholder; a look-alike (version numbers, OIDs,
section numbers, code constants, hashes, reserved ranges, ...) is right when the text comes out
unchanged. A case written (language, text) is a document whose meta.language is that code: phones
in the national formats of ja de fr es pt zh ko ru, with their phone words, and dates, amounts and
section numbers written in those languages. Card numbers are completed with a Luhn check digit from
issuer prefixes; everything else is literal.
  recall     positive cases redacted exactly as labelled / positive cases
  precision  correct redactions / all redactions (a wrong or extra placeholder in a positive case,
             and any placeholder in a look-alike, counts against it)
Speed: the step's redaction over about `--mb` MB of local text (/usr/share/doc, the licenses,
the standard library's docstrings; benchmarks/dedup_corpus.local_texts) plus the standard
library's Python source (code is where digit runs and `+` live), best of `--repeats`, one core.
What it redacted there is printed per kind with a few examples, to be read by a person: that text
has no labels.
Ends with: RESULT recall=.. precision=.. mb_s=.. (and per kind: recall_<kind>=.. precision_<kind>=..;
recall_languages=.. precision_languages=.. over the cases with a language)
"""

from __future__ import annotations

import argparse
import re
import sysconfig
import time
from collections import Counter
from pathlib import Path

from dedup_corpus import local_texts, read_local_file

from kiln.curate.steps.pii import PLACEHOLDERS, PIIConfig, RedactPII


def luhn_complete(prefix: str, length: int) -> str:
    """prefix padded with a fixed digit pattern to length - 1, then the Luhn check digit."""
    body = (prefix + "7392018465" * 2)[: length - 1]
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:  # these are doubled once the check digit is appended
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return body + str((10 - total % 10) % 10)


def grouped(number: str, sizes: tuple[int, ...], sep: str) -> str:
    out, at = [], 0
    for size in sizes:
        out.append(number[at : at + size])
        at += size
    return sep.join(out)


# --- personal data ---------------------------------------------------------------------------------

EMAILS = [
    "Contact [[maria.garcia@gmail.com]] for details.",
    "From: [[j.smith@outlook.com]]",
    "Reply to <[[anna_k@yahoo.co.uk]]>",
    "Signed-off-by: Jan Novak <[[jan.novak@seznam.cz]]>",
    "email me at [[pierre+lists@orange.fr]] please",
    "[[li.wei@163.com]]",
    "Reported-by: [[k.tanaka@docomo.ne.jp]]",
    "cc: [[olga.ivanova@mail.ru]], thanks",
    "maintainer: [[bob@bobsworkshop.net]]",
    "mailto:[[sales.team@acme-widgets.com]]",
    "write to [[josé.pérez@correo.es]]",
    "[[d.mueller@t-online.de]] wrote:",
    "Author: Sam Lee <[[sam.lee@protonmail.com]]>",
    "user [[x_ae_12@hotmail.com]] logged in",
    "({[[ravi.k@rediffmail.com]]})",
    "Send CV to [[hr@smallbakery.co.nz]].",
    "[[first.last@university.edu]] is my address",
    "owner=[[tom.h@fastmail.fm]]",
    "e-mail: [[lucia.rossi@libero.it]]",
    "Patch from [[ahmed.said@gmx.net]]",
    "[[nguyen.van.a@vnn.vn]]; [[tran.b@fpt.vn]]",
    "ping [[chris@personal-blog.io]] on this",
    "Thanks to [[emma.w@icloud.com]]!",
    "customer: [[wang.fang@qq.com]]",
    '"email": "[[p.kowalski@wp.pl]]"',
    "Questions? [[ines.silva@sapo.pt]]",
    "Debian maintainer <[[mk@debian-fan.org]]>",
    "Originally by [[hans.berg@telia.se]] (2009)",
    "[[a.b.c.d@sub.mail.example-company.com]]",
    "notify [[ops-oncall@startup.ai]]",
]
PHONES = [
    "Call me on [[+1 415 555 2671]] tomorrow.",
    "Tel: [[+44 20 7946 0958]]",
    "Telefon: [[+49 30 901820]]",
    "[[+33 1 42 68 53 00]] (Paris office)",
    "mobile [[+91 98765 43210]]",
    "Phone: [[+61 2 9374 4000]]",
    "ring [[+81 3-1234-5678]] after 9",
    "WhatsApp [[+34 612 34 56 78]]",
    "[[+39 06 6988 4000]]",
    "Fax [[+31 20 552 9111]]",
    "call [[(212) 555-0143]] now",
    "Office: [[415-555-2671]]",
    "[[312.555.0187]] (cell)",
    "Toll: [[1-617-555-0110]]",
    "Tel.: [[+46 8 123 456 78]]",
    "reach her at [[+55 11 91234-5678]]",
    "[[+7 495 123-45-67]]",
    "contact: [[+27 21 123 4567]]",
    "[[+52 55 1234 5678]] ext. 2",
    "Tel [[+86 10 6552 9988]]",
    "tel:[[+14155552671]]",
    "phone: [[020 7946 0958]]",
    "Tel. [[030 901820]]",
    "Mobile: [[07700 900123]]",
    "appelez le [[01 42 68 53 00]]",
    "Handy: [[0171 1234567]]",
    "call [[(02) 9374 4000]]",
    "Ph: [[+64 9 379 1234]]",
    "[[+353 1 234 5678]] (Dublin)",
    "Call [[+1 (646) 555-0199]] to book.",
    # Area codes no one is assigned (968, 987, 292, 375, 462, 538): libphonenumber calls these invalid;
    # the phone word right before says what they are.
    "# Contact Ann Lee, mobile [[968.909.5111]].",
    "Phone: [[987-654-3210]]",
    "tel:[[+12925550123]]",
    "Tel. [[(375) 909-5111]]",
    "Mob: [[+1 462 555 0188]]",
    "ph: [[538.555.0147]]",
    "fax [[968-555-0100]] (office)",
    "Call me at [[1-987-555-0166]] after six",
    '"phone": "[[292-555-0139]]"',
    "Cell:\n[[(968) 555-0177]]",
    # National formats read with the document's language: ja JP, de DE, fr FR, es ES and MX, pt BR and PT, zh CN and
    # TW, ko KR, ru RU. Those without a trunk 0 (612 34 56 78, 138 0013 8000, (11) 96123-4567, 8 (495) ...) and
    # 032-9230-0209 are valid in none of the default phone_regions: only the language finds them.
    ("ja", "お問い合わせは [[03-1234-5678]] まで"),
    ("ja", "携帯：[[090-1234-5678]]"),
    ("ja", "電話番号：[[06-6123-4567]]"),
    ("ja", "TEL [[045-123-4567]]"),
    ("de", "Telefon: [[030 901820]]"),
    ("de", "Rufen Sie [[0171 1234567]] an"),
    ("de", "Mobilnummer: [[0151 23456789]]"),
    ("fr", "Tél. : [[01 42 68 53 00]]"),
    ("fr", "appelez le [[06 12 34 56 78]]"),
    ("fr", "Téléphone : [[04 72 10 30 30]]"),
    ("es", "Llame al [[612 34 56 78]]"),
    ("es", "Teléfono: [[91 123 45 67]]"),
    ("es", "móvil [[612 345 678]]"),
    ("es", "Tel. [[55 1234 5678]] (CDMX)"),
    ("pt", "Ligue [[(11) 96123-4567]]"),
    ("pt", "Telefone: [[11 2345-6789]]"),
    ("pt", "telemóvel [[912 345 678]]"),
    ("pt", "Tel.: [[21 234 5678]]"),
    ("zh", "请拨打 [[138 0013 8000]]"),
    ("zh", "电话：[[010-6552-9988]]"),
    ("zh", "手机 [[139-1234-5678]]"),
    ("zh", "聯絡電話：[[02-2345-6789]]"),
    ("ko", "문의 [[02-3456-7890]]"),
    ("ko", "휴대폰: [[010-1234-5678]]"),
    ("ko", "전화번호: [[032-9230-0209]]"),
    ("ru", "Звоните: [[8 (495) 123-45-67]]"),
    ("ru", "Телефон: [[8 800 555-35-35]]"),
    ("ru", "тел. [[(812) 123-45-67]]"),
    ("ru", "моб. [[8-912-345-67-89]]"),
]
IPS = [
    "Failed password for root from [[61.177.172.13]] port 22 ssh2",
    "client [[93.184.216.34]] connected",
    "X-Forwarded-For: [[81.2.69.160]]",
    '[[66.249.66.1]] - - [12/Oct/2024:10:01:02 +0000] "GET / HTTP/1.1" 200',
    "my home IP is [[86.31.12.207]]",
    "server at [[151.101.1.69]]:443",
    "Accepted publickey for deploy from [[185.199.108.153]]",
    "blocked [[45.33.32.156]] after 5 attempts",
    "ping [[104.16.132.229]]",
    "remote_addr=[[52.95.110.1]]",
    "Connection from [[140.82.112.3]] refused",
    "[[172.217.16.142]] responded in 12 ms",
    "banned IP: [[31.13.72.36]]",
    "our office ([[17.253.144.10]]) is down",
    "ssh admin@[[34.117.59.81]]",
    "inet [[23.45.67.89]]/24 brd",
    "host [[77.88.55.60]] unreachable",
    "session from [[2a00:1450:4001:81c::200e]]",
    "IPv6 [[2606:4700::6810:84e5]] answered",
    "client=[[2a03:2880:f12f:83:face:b00c:0:25de]]",
    "mapped [[::ffff:93.184.216.34]] here",
    "proxy [[195.154.122.113]] open",
    "login attempt from [[118.25.6.39]]",
    "peer [[213.180.204.3]] dropped",
    "src=[[91.198.174.192]] dst=[[208.80.154.224]]",
    "The attacker used [[5.188.10.176]].",
    "geo lookup for [[49.36.128.9]]",
    "[[2001:67c:2e8:22::c100:68b]] is our mirror",
    "IP address: [[202.12.27.33]]",
    "allow from [[130.89.148.77]];",
    # Near the word "version", capitalized at a line's start, or in log lines with dates: still addresses.
    "version check from [[93.184.216.34]] failed",
    '"version": "2.1", "server": "[[151.101.1.69]]"',
    "__version__ = '2.1'  # served from [[185.199.108.153]]",
    "release notes mirror: [[130.89.148.77]]",
    "Server [[77.88.55.60]] refused the connection",
    "Added [[45.33.32.156]] to the blocklist",
    "From [[61.177.172.13]]: GET /version",
    "2024-10-12 10:01:02 [[118.25.6.39]] GET /update/version.json 200",
    "[[31.13.72.36]] - 2024-10-12 10:01:02 banned",
    "Trying [[52.95.110.1]]...",
]
cards = [
    ("4", 16),
    ("4", 16),
    ("4", 13),
    ("4", 19),
    ("51", 16),
    ("53", 16),
    ("55", 16),
    ("2221", 16),
    ("2720", 16),
    ("34", 15),
    ("37", 15),
    ("6011", 16),
    ("65", 16),
    ("644", 16),
    ("3528", 16),
    ("3589", 16),
    ("36", 14),
    ("300", 14),
    ("38", 16),
    ("62", 16),
    ("62", 19),
    ("5018", 16),
    ("6759", 16),
    ("2200", 16),
    ("4", 16),
    ("51", 16),
    ("37", 15),
    ("6011", 16),
    ("4", 16),
    ("55", 16),
]
CARD_CONTEXTS = ["card {} exp 09/27", "Visa: {}", "paid with {}.", "cc_number={}", '"pan": "{}"', "Card no. {}"]
CARDS = []
for i, (prefix, length) in enumerate(cards):
    number = luhn_complete(prefix, length)
    if length == 16 and i % 3 == 1:
        number = grouped(number, (4, 4, 4, 4), " " if i % 2 else "-")
    elif length == 15 and i % 2:
        number = grouped(number, (4, 6, 5), " ")
    CARDS.append(CARD_CONTEXTS[i % len(CARD_CONTEXTS)].format("[[" + number + "]]"))
SSNS = [
    f"{label}[[{area}-{group}-{serial}]]{after}"
    for (label, after), (area, group, serial) in zip(
        [
            ("SSN: ", "."),
            ("Social Security Number ", ""),
            ("ssn=", ""),
            ("SSN ", " on file"),
            ("(SSN ", ")"),
            ("my ssn is ", ""),
        ]
        * 5,
        [
            ("536", "22", "8745"),
            ("219", "48", "1234"),
            ("412", "67", "9012"),
            ("001", "01", "0001"),
            ("665", "99", "9999"),
            ("772", "10", "2048"),
            ("345", "61", "7723"),
            ("501", "33", "2000"),
            ("899", "12", "3456"),
            ("667", "01", "1111"),
            ("123", "44", "6789"),
            ("078", "06", "1120"),
            ("212", "09", "9999"),
            ("604", "75", "3310"),
            ("730", "18", "4421"),
            ("055", "27", "8812"),
            ("490", "83", "0101"),
            ("318", "30", "5567"),
            ("287", "65", "4321"),
            ("164", "52", "9987"),
            ("701", "01", "0002"),
            ("555", "55", "5555"),
            ("008", "90", "1234"),
            ("380", "04", "7710"),
            ("622", "45", "3302"),
            ("459", "71", "6120"),
            ("246", "08", "1357"),
            ("137", "92", "8462"),
            ("888", "88", "8888"),
            ("521", "14", "0903"),
        ],
        strict=True,
    )
]
SECRETS = [
    "aws_access_key_id = [[AKIAZ7QF3RXB2KD4HM6P]]",
    "export AWS_ACCESS_KEY_ID=[[ASIAQW3ER5TY7UI9OP1L]]",
    "aws_secret_access_key = [[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]]",
    "token: [[ghp_4Kd9QmX2vB7nR1tY6uW3zL8pA5sE0cF2hJ9k]]",
    "GITHUB_TOKEN=[[gho_Z9x8C7v6B5n4M3l2K1j0H9g8F7d6S5a4Q3w2]]",
    "[[github_pat_11ABCDEFG0123456789abc_" + "Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9Lz2Xc4Vb6Nm8Qw0Er2Ty4Ui6Op8As0Df]]",
    "GITLAB_TOKEN=[[glpat-x7Kq2Lm9Np4Rs6Tv8Wz1Y]]",
    "SLACK_BOT_TOKEN=[[xoxb-2918273645-5039485721-kD8sL2mQ9xZ4vN7bT1cR6wY3]]",
    "webhook: [[https://hooks.slack.com/services/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]]",
    'stripe.api_key = "[[sk_live_51HqX9kL2mN8pQ4rS7tV1wY3z]]"',
    "STRIPE_KEY=[[rk_live_9aB8cD7eF6gH5iJ4kL3mN2oP]]",
    "key=[[AIzaSyD8kQ3mX9vL2nP7rT4wY6zB1cF5hJ0gK3s]]",
    "OPENAI_API_KEY=[[sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z]]",
    "ANTHROPIC_API_KEY=[[sk-ant-api03-Zx9Cv8Bn7Mm6Ll5Kk4Jj3Hh2Gg1Ff0Dd9Ss8Aa7Qq6Ww5Ee4Rr3Tt2Yy1Uu0Ii9Oo8Pp7]]",
    "HF_TOKEN=[[hf_QmX2vB7nR1tY6uW3zL8pA5sE0cF2hJ9kDd]]",
    "//registry.npmjs.org/:_authToken=[[npm_4Kd9QmX2vB7nR1tY6uW3zL8pA5sE0cF2hJ9k]]",
    "password = [[pypi-AgEIcHlwaS5vcmcCJDk4ZjQ2ZTFkLTRhMjMtNGQ4Yi05YzBm]]",
    "SENDGRID_API_KEY=[[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]]",
    (
        "Authorization: Bearer "
        "[[eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U]]"
    ),
    "a\n[[-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM\n-----END RSA PRIVATE KEY-----]]\nb",
    (
        "[[-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE "
        "KEY-----]]"
    ),
    "[[-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oGL\n-----END EC PRIVATE KEY-----]]",
    "DB_PASSWORD=[[f8Kq2Lm9Np4Rs6Tv]]",
    'password: "[[X7k!pQ2m#Lz9vR4t]]"',
    '"client_secret": "[[GOCSPX-4kD9qmX2vB7nR1tY6uW3zL8pA5s]]"',
    "SECRET_KEY = '[[django-insecure-8v#k2q!m9x@l4p7r1t6w3z8b5c0f2h9j]]'",
    "auth_token=[[9f3a7c1e5b2d8f4a6c0e1b3d5f7a9c2e]]",
    "api_key: [[Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg]]",
    "AccountKey=[[q7Wz2Xk9Lm4Np8Rs1Tv6Yb3CdE5fG7hJ9kL2mN4pQ6rS8tU0vW2xY4zA6bC8dE0fGh1Ij3Kl5Mn7Op9Qr1St3Uv5Wx==]]",
    "private_key: [[5Kb8kLf9zgWQnogidDA76MzPL6TsZZY36hWXMssSzNydYXYB9KF]]",
]

# --- look-alikes -----------------------------------------------------------------------------------

EMAIL_LOOKALIKES = [
    "user@localhost",
    "name@",
    "a@b",
    "@handle",
    "logo@2x.png",
    "icon@3x.webp",
    "someone@example.com",
    "x@test.invalid",
    "admin@example.org",
    "git@github.com:kiln/kiln.git",
    "git@gitlab.com:group/project.git",
    "root@localhost.localdomain",
    "pi@raspberrypi.local",
    "npm install @babel/core@7.24.0",
    "lodash@4.17.21",
    "python@3.11",
    "@media screen",
    "@property def x(self)",
    "a@b.c",
    "nginx@sha256:3b7e45fd22",
    "user@host",
    "foo@@bar.com",
    "@@ -1,4 +1,5 @@",
    "ssh -p 22 deploy@10.0.0.5",
    "$@ and $*",
    "image: redis@sha256:0123abcd",
    "twitter @kiln_dev",
    "x = a @ b  # matmul",
    "printer@office.lan",
    "svc@cluster.internal",
]
PHONE_LOOKALIKES = [
    "x = 4294967296  # 1 << 32",
    "t = 1700000000",
    "mask = 0x7fffffff",
    "return a+1234567890",
    "y = (x)+4155552671",
    "id: 12345678901",
    "2024-01-15 10:30:00",
    "ISBN 0-306-40615-2",
    "+1.5 dB",
    "+20.000.000",
    "pi = 3.14159265358979",
    "123-456-7890",
    "555-123-4567",
    "(555) 123-4567",
    "offset +36000 s",
    "total: +1 234",
    "E = mc^2 + 10 20 30 40",
    "port 8080-8090",
    "v1.2.3-4567",
    "timestamp=1699999999999",
    "a = b + 0800 1234",
    "score 10-20-30",
    "0.0.0.0/0",
    "x += 16777216",
    "seed = 20240115",
    "ranges 100-200-3000",
    "sha1 356a192b7913b04c54574d18c28d46e6395428ab",
    "+44",
    "call 911",
    "order #4155552671",
    # An unassigned area code and no phone word right before: validity decides, as without the word.
    "ticket 968.909.5111",
    "968-909-5111",
    "(987) 654-3210 rows",
    "mobile build 968-909-5111",
    "Hotel 987-555-0123",
    # Dates, times, amounts and other numbers of documents in those languages.
    ("ja", "2024年1月15日 10:30"),
    ("ja", "ISBN 978-4-06-521234-5"),
    ("de", "am 01.02.2024 12:30 Uhr"),
    ("de", "Summe: 1 234 567 890 Euro"),
    ("de", "ISBN 978-3-16-148410-0"),
    ("fr", "le 01/02/2024 à 12:30"),
    ("fr", "1 234 567 890 habitants"),
    ("es", "el 15-01-2024 a las 10:30"),
    ("es", "612.345.678 euros"),
    ("es", "presupuesto de 123 456 789 €"),
    ("es", "ISBN 84-376-0494-2"),
    ("pt", "em 15/01/2024 às 10:30"),
    ("pt", "CEP 01310-100"),
    ("pt", "R$ 123 456 789"),
    ("pt", "CPF 123.456.789-09"),
    ("zh", "2024-01-15 10:30:00"),
    ("zh", "1998-2003 2005-2010 年"),
    ("ko", "2024-01-15 10:30"),
    ("ko", "1,234,567,890원"),
    ("ru", "15.01.2024 10:30"),
    ("ru", "123 456 789 руб."),
    ("ru", "ИНН 7707083893"),
    ("ru", "ГОСТ 7.1-2003"),
]
IP_LOOKALIKES = [
    "Bump Standards-Version to 4.6.0.1",
    "Standards-Version: 4.5.0.2",
    "xft (2.3.2.1-7) unstable; urgency=low",
    "libfoo (1.2.3.4+dfsg-1) sid",
    "New upstream version 1.4.2.1",
    "version 10.0.19041.1",
    "OID 1.3.6.1.4.1.311",
    "see section 4.2.1.3",
    "§ 3.1.4.1 applies",
    "upgrade to 5.15.0.1",
    "Table 2.3.1.4",
    "firmware 4.1.1.2",
    "Release: 10.2.0.1",
    "v2.7.15.1",
    "1.2.3.4.5.6",
    "999.1.1.1",
    "private 192.168.0.10",
    "loopback 127.0.0.1",
    "169.254.1.1",
    "listen 0.0.0.0:80",
    "192.0.2.55",
    "198.51.100.7",
    "203.0.113.9",
    "2001:db8::10",
    "fe80::1ff:fe23:4567:890a",
    "::1",
    "12:34:56",
    "de:ad:be:ef:00:01",
    "nameserver 8.8.8.8",
    "10.0.0.1",
    # Four-part versions that are public addresses: after a product's name, in a changelog heading, assigned to a
    # version name.
    "XFree86 4.3.0.1",
    "built with Python 3.11.7.1",
    "OpenSSL 1.2.11.4 fixes",
    "linux-4.3.0.1.tar.gz",
    "Changes in 1.2.11.4 (10 August 2003)",
    "## 1.2.3.4 - 2020-01-01",
    "What's new in at-spi2-core 2.44.1.1:",
    "Release 2.0.1.5",
    '__version__ = "1.2.11.4"',
    "VERSION='4.3.0.1'",
    '"version": "1.0.0.2"',
    '[assembly: AssemblyVersion("4.3.0.1")]',
    # Section numbers and versions in other languages (public addresses all).
    ("ja", "第 4.6.1.2 節を参照"),
    ("ja", "セクション 1.2.3.4"),
    ("ja", "1.2.3.4 節"),
    ("de", "siehe Abschnitt 3.4.1.2"),
    ("fr", "voir la section 2.1.4.1"),
    ("fr", "version 2.1.0.4"),
    ("es", "Sección 6.2.1.2"),
    ("pt", "Seção 1.2.3.4"),
    ("zh", "第 4.6.1.2 节"),
    ("zh", "版本 2.1.0.4"),
    ("ko", "4.6.1.2절"),
    ("ru", "Раздел 1.2.3.4"),
    ("ru", "в разделе 93.184.216.34"),
]
CARD_LOOKALIKES = [
    luhn_complete("1", 16),
    luhn_complete("7", 16),
    luhn_complete("8", 16),
    luhn_complete("9", 16),
    luhn_complete("0", 16),
    luhn_complete("34", 16),
    luhn_complete("37", 14),
    luhn_complete("4", 15),
    luhn_complete("51", 19),
    luhn_complete("56", 16),
    luhn_complete("59", 16),
    luhn_complete("6012", 16),
    luhn_complete("3510", 16),
    luhn_complete("39", 13),
    luhn_complete("2100", 16),
    "4111111111111112",
    "9780306406157",
    "978-0-306-40615-7",
    "12345678901234567890",
    "0.4111111111111111",
    "IMEI 35-209900-176148-1",
    "IMEI " + luhn_complete("35", 15),
    "timestamp_ms=1700000000000",
    "order 2023-1105-7781-0042",
    "tracking 1Z999AA10123456784",
    "x = 4111111111111111.5",
    "id/4111111111111111/",
    "v4111111111111111",
    "size 4 111 111 111",
    "uuid 12345678-1234-5678-1234-567812345678",
]
SSN_LOOKALIKES = [
    "000-12-3456",
    "666-12-3456",
    "900-12-3456",
    "999-99-9999",
    "950-45-6789",
    "123-00-4567",
    "123-45-0000",
    "078-05-1120",
    "219-09-9999",
    "123-45-6789",
    "2023-10-12",
    "12-05-2024",
    "555-1234",
    "ABC-123-45-6789",
    "123-45-67890",
    "1123-45-6789",
    "123-456-7890",
    "12-345-6789",
    "v123-45-6789",
    "123-45-6789-1",
    "page 12-34",
    "(900) 45-6789",
    "0-123-45-6789",
    "x123-45-6789",
    "666-66-6666",
    "987-65-4321",
    "000-00-0000",
    "321-00-0001",
    "456-78-0000",
    "9 123-45-678",
]
SECRET_LOOKALIKES = [
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "md5sum: d41d8cd98f00b204e9800998ecf8427e",
    'password = os.environ["DB_PASSWORD"]',
    "password: ${DB_PASSWORD}",
    "token = get_token()",
    "secret = None",
    'password = "changeme"',
    'password: "********"',
    'api_key = "<your-api-key>"',
    'api_key = "YOUR_API_KEY"',
    'token_type = "bearer"',
    'secret_name = "prod-db-credentials"',
    "max_tokens = 4096",
    "sk-learn-is-a-very-long-kebab-case-name-here",
    "pk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "AKIA1234",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8A\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBa\n-----END CERTIFICATE-----",
    'integrity="sha512-9Yv6QzKxLw0pNq1Rb8Zt3Hs5Jm2Fc7Vd4Gk1Xe6Aa0Po9Ui8Yt7Re6Wq5Sd4Fg3Hj2Kl1Zx0Cv9Bn8Mm7Ll6Kk5Jj4=="',
    "image@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "request_id=7c9e6679-7425-40de-944b-e07fc1f90ae7",
    "password_hash = pbkdf2_sha256",
    "token = self.tokenizer.encode(text)",
    "secret: !vault |",
    "PASSWORD_MIN_LENGTH = 12",
    "git rev-parse HEAD  # 3f786850e387550fdab836ed7e6dc881de23001b",
    '"sha1": "da39a3ee5e6b4b0d3255bfef95601890afd80709"',
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    "tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904",
]

POSITIVE = {"email": EMAILS, "phone": PHONES, "ip_address": IPS, "credit_card": CARDS, "ssn": SSNS, "secret": SECRETS}
LOOKALIKE = {
    "email": EMAIL_LOOKALIKES,
    "phone": PHONE_LOOKALIKES,
    "ip_address": IP_LOOKALIKES,
    "credit_card": CARD_LOOKALIKES,
    "ssn": SSN_LOOKALIKES,
    "secret": SECRET_LOOKALIKES,
}
MARKED = re.compile(r"\[\[(.+?)\]\]", re.DOTALL)
ANY_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS.values()))


Case = str | tuple[str, str]  # a text, or (meta.language, text)


def score(step: RedactPII) -> tuple[dict[str, tuple[int, int, int]], list[str]]:
    """Per kind, and for the cases with a language as "languages": (correct redactions, missed values, wrong
    redactions); and a line per failed case."""
    counts: dict[str, list[int]] = {kind: [0, 0, 0] for kind in [*POSITIVE, "languages"]}
    failures = []

    def add(kind: str, case: Case, correct: int, missed: int, wrong: int) -> None:
        for key in (kind, "languages") if isinstance(case, tuple) else (kind,):
            counts[key][0] += correct
            counts[key][1] += missed
            counts[key][2] += wrong

    for kind in POSITIVE:
        for case in POSITIVE[kind]:
            language, marked = case if isinstance(case, tuple) else (None, case)
            text = MARKED.sub(r"\1", marked)
            expected = MARKED.sub(PLACEHOLDERS[kind].replace("\\", "\\\\"), marked)
            out = step.redact(text, language)[0]
            values = len(MARKED.findall(marked))
            if out == expected:
                add(kind, case, values, 0, 0)
            else:
                add(kind, case, 0, values, len(ANY_PLACEHOLDER.findall(out)))
                failures.append(f"  {kind} missed{f' ({language})' if language else ''}: {text!r} -> {out!r}")
        for case in LOOKALIKE[kind]:
            language, text = case if isinstance(case, tuple) else (None, case)
            out = step.redact(text, language)[0]
            if out != text:
                add(kind, case, 0, 0, max(1, len(ANY_PLACEHOLDER.findall(out))))
                failures.append(
                    f"  {kind} look-alike changed{f' ({language})' if language else ''}: {text!r} -> {out!r}"
                )
    return {kind: (c[0], c[1], c[2]) for kind, c in counts.items()}, failures


def corpus(mb: float) -> list[str]:
    """About `mb` MB of local prose and documentation, and as much of the standard library's source."""
    texts, size = [], 0
    for _, _, text in local_texts():
        texts.append(text)
        size += len(text.encode())
        if size >= mb * 1e6 / 2:
            break
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if size >= mb * 1e6:
            break
        if (text := read_local_file(path)) is None:
            continue
        texts.append(text)
        size += len(text.encode())
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20.0, help="MB of local text to time the step on.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes over that text; the best counts.")
    parser.add_argument("--examples", type=int, default=4, help="Redactions shown per kind from the local text.")
    args = parser.parse_args()
    step = RedactPII(PIIConfig())

    per_kind, failures = score(step)
    print(f"{'kind':<12} {'cases':>6} {'look-alikes':>12} {'recall':>7} {'precision':>10}")
    fields = {}
    for kind, (correct, missed, wrong) in per_kind.items():
        recall, precision = correct / (correct + missed), correct / max(correct + wrong, 1)
        cases = [c for k in POSITIVE if k == kind or kind == "languages" for c in POSITIVE[k]]
        lookalikes = [c for k in LOOKALIKE if k == kind or kind == "languages" for c in LOOKALIKE[k]]
        if kind == "languages":  # the cases with a language, already counted under their kind
            cases, lookalikes = (
                [c for c in cases if isinstance(c, tuple)],
                [c for c in lookalikes if isinstance(c, tuple)],
            )
        print(f"{kind:<12} {len(cases):>6} {len(lookalikes):>12} {recall:>7.3f} {precision:>10.3f}")
        fields[f"recall_{kind}"], fields[f"precision_{kind}"] = recall, precision
    correct, missed, wrong = (sum(v[i] for k, v in per_kind.items() if k != "languages") for i in range(3))
    print("\n".join(failures) or "every case right")

    texts = corpus(args.mb)
    nbytes = sum(len(t.encode()) for t in texts)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        outputs = [step.redact(t) for t in texts]
        best = min(best, time.perf_counter() - start)
    hits = Counter()
    examples: dict[str, list[str]] = {kind: [] for kind in PLACEHOLDERS}
    for out, found in outputs:
        hits.update({k: n for k, n in found.items() if n})
        for kind, placeholder in PLACEHOLDERS.items():
            at = out.find(placeholder) if found[kind] else -1
            if at >= 0 and len(examples[kind]) < args.examples:
                examples[kind].append(out[max(0, at - 40) : at + len(placeholder) + 30].replace("\n", " "))
    print(
        f"local text: {nbytes / 1e6:.1f} MB in {len(texts)} documents, {nbytes / 1e6 / best:.2f} MB/s (best of "
        f"{args.repeats}); redactions: {dict(hits) or 'none'}"
    )
    for kind, shown in examples.items():
        for line in shown:
            print(f"  {kind}: ...{line}...")
    summary = (
        f"recall={correct / (correct + missed):.4f} precision={correct / max(correct + wrong, 1):.4f} "
        f"mb_s={nbytes / 1e6 / best:.2f}"
    )
    print("RESULT " + summary + " " + " ".join(f"{k}={v:.3f}" for k, v in fields.items()))


if __name__ == "__main__":
    main()

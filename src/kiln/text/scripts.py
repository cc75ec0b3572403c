"""Which script a text is written in: the ISO 15924 code of the script that holds most of its letters.

A letter is a character Python calls alphabetic (Unicode categories L*); its script is Unicode's Script
property (read with the `regex` module, whose property aliases are the ISO 15924 codes). Letters are
weighed by how much text each stands for (LETTER_WEIGHTS: a Han character about three Latin letters), so a
Chinese page full of Latin command names is still Han. Three scripts are resolved further, since a language
is written with more than one of them:
- Han with kana (Hiragana, Katakana) is one group; with kana at least KANA_MIN_SHARE of the group the
  text is Japanese, `Jpan`;
- otherwise Han is Simplified `Hans` or Traditional `Hant` by which of two tables of frequent characters
  that exist in only one form (below) it holds more of, and `Hani` (Han, form undecided) on a tie;
- Serbian, Bosnian, Uzbek... need nothing special: Cyrillic letters give `Cyrl`, Latin ones `Latn`.
A text with no letters (digits, punctuation, emoji, empty) is `Zyyy` (ISO 15924's "common"); a letter of a
script newer than the installed `regex` module knows counts as `Zzzz` ("uncoded").
Not handled: Korean written with many Hanja (reported `Hang` or, past half its letters, as Han: ISO's
`Kore` is not used), Japanese written without kana (read as Han), and a text mixing scripts gets only
the largest (kiln.text.language's paragraph shares tell languages apart, not scripts).
"""

from __future__ import annotations

import re
import threading

import numpy as np
import regex

# Every script Unicode gives letters to, by ISO 15924 code; the common ones first, since a character's script
# is the first one that matches. Zyyy and Zinh (letters shared by scripts, such as the prolonged sound mark
# U+30FC) come last and count for none.
_UNICODE_SCRIPTS = (
    "Latn Cyrl Arab Hani Hira Kana Hang Deva Thai Grek Hebr Beng Taml Telu Knda Mlym Gujr Guru Orya Sinh Mymr "
    "Khmr Laoo Tibt Geor Armn Ethi Thaa Syrc Mong Tfng Cher Cans Nkoo Olck Java Sund Bali Bugi Yiii Vaii Bopo "
    "Tglg Copt Adlm Aghb Ahom Armi Avst Bamu Bass Batk Bhks Brah Brai Buhd Cakm Cari Cham Chrs Cpmn Cprt Diak "
    "Dogr Dsrt Dupl Egyp Elba Elym Glag Gong Gonm Goth Gran Hano Hatr Hluw Hmng Hmnp Hung Ital Kali Kawi Khar "
    "Khoj Kits Kthi Lana Lepc Limb Lina Linb Lisu Lyci Lydi Mahj Maka Mand Mani Marc Medf Mend Merc Mero Modi "
    "Mroo Mtei Mult Nagm Nand Narb Nbat Newa Nshu Ogam Orkh Osge Osma Ougr Palm Pauc Perm Phag Phli Phlp Phnx "
    "Plrd Prti Rjng Rohg Runr Samr Sarb Saur Sgnw Shaw Shrd Sidd Sind Sogd Sogo Sora Soyo Sylo Tagb Takr Tale "
    "Talu Tang Tavt Tirh Tnsa Toto Ugar Vith Wara Wcho Xpeo Xsux Yezi Zanb"
).split()
_SHARED = ("Zyyy", "Zinh")
COMMON, UNCODED, HAN, JAPANESE, SIMPLIFIED, TRADITIONAL = "Zyyy", "Zzzz", "Hani", "Jpan", "Hans", "Hant"
KANA = ("Hira", "Kana")
# The codes text_script can return: a script of the table except kana (always part of Jpan), and the resolved ones.
SCRIPTS = frozenset(_UNICODE_SCRIPTS) - set(KANA) | {JAPANESE, SIMPLIFIED, TRADITIONAL, COMMON, UNCODED}
# Kana are 78% of the Han and kana of the ja catalogs; Chinese text holds a katakana name now and then, far under
# this share.
KANA_MIN_SHARE = 0.05
# How many English letters one letter of a script stands for, where not about one: measured on the parallel
# gettext sentences of benchmarks/lid_compare.py (289 messages; the Latin letters of program names set aside):
# 15,199 English letters against 4,981 Han in zh_CN (2.8 each), 6,827 Hangul in ko (2.1), and in ja 1,766 Han with
# 6,350 kana (1.4 each at 2.8 a Han); Cyrillic 0.89 and Thai 1.24 there count 1. Rounded, so that a share reads
# as a share of the text: English with a Chinese paragraph of the same content is 50/50, not 75/25.
LETTER_WEIGHTS = {HAN: 3.0, "Hang": 2.0, "Hira": 1.5, "Kana": 1.5}


def _known(code: str) -> bool:
    try:
        regex.compile(rf"\p{{sc={code}}}")
    except regex.error:  # a script added to Unicode after the installed regex module's tables
        return False
    return True


_GROUPS = [code for code in (*_UNICODE_SCRIPTS, *_SHARED) if _known(code)]
# One alternative per script: a character's script is the number of the group that matched.
_SCRIPT_PATTERN = regex.compile("|".join(rf"(\p{{sc={code}}})" for code in _GROUPS))
_CODES = [*(code for code in _GROUPS if code not in _SHARED), UNCODED]  # index -> script code
_INDEX = {code: i for i, code in enumerate(_CODES)}
_WEIGHTS = np.array([LETTER_WEIGHTS.get(code, 1.0) for code in _CODES])
_UNSEEN, _NO_SCRIPT = -1, -2
# Code point -> index of its script in _CODES, _NO_SCRIPT for a non-letter or a shared letter, _UNSEEN until
# first met (2.2 MB per process). perf: filled as code points turn up, so the regex runs once per character.
_script_index = np.full(0x110000, _UNSEEN, dtype=np.int16)
_fill_lock = threading.Lock()
_ASCII_LETTER = re.compile("[A-Za-z]")
_NOT_ASCII_LETTERS = re.compile("[^A-Za-z]+")
_ASCII_NOT_LETTERS = bytes(c for c in range(128) if not chr(c).isalpha())


def char_script(char: str) -> str | None:
    """The ISO 15924 code of a letter's script (`Hira`, `Kana` and `Hani` as Unicode has them), None for a
    character that is not a letter or is a letter of no one script."""
    if not char.isalpha():
        return None
    m = _SCRIPT_PATTERN.match(char)
    code = UNCODED if m is None else _GROUPS[m.lastindex - 1]
    return None if code in _SHARED else code


def _distinct(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the distinct code points of a non-ASCII text, how often each occurs, the index of each one's script)."""
    # perf: np.unique over the UTF-32 code points runs at about 190 MB/s, 4x collections.Counter on the same text;
    # surrogatepass keeps a lone surrogate (text read with surrogateescape) as the code point it is
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    points, counts = np.unique(points, return_counts=True)
    index = _script_index[points]
    if (index == _UNSEEN).any():
        with _fill_lock:
            for point in points[index == _UNSEEN].tolist():
                code = char_script(chr(point))
                _script_index[point] = _NO_SCRIPT if code is None else _INDEX[code]
        index = _script_index[points]
    return points, counts, index


def script_letters(text: str) -> dict[str, int]:
    """How many letters of `text` each Unicode script holds (`Hira`, `Kana`, `Hani` apart; not weighted),
    largest first."""
    if text.isascii():  # perf: English and code in one C pass
        n = len(_NOT_ASCII_LETTERS.sub("", text))
        return {"Latn": n} if n else {}
    _, counts, index = _distinct(text)
    letters = index >= 0
    totals = np.bincount(index[letters], weights=counts[letters], minlength=len(_CODES))
    found = {_CODES[i]: int(totals[i]) for i in np.flatnonzero(totals).tolist()}
    return dict(sorted(found.items(), key=lambda item: (-item[1], item[0])))


def weighted_letters(text: str) -> float:
    """The letters of `text`, each weighed by LETTER_WEIGHTS (the measure of a paragraph's share in
    kiln.text.language); as in script_letters, a letter of no one script (U+30FC) counts for none."""
    if text.isascii():  # perf: bytes.translate deletes the rest in one C pass, 5x a regex
        return float(len(text.encode("ascii").translate(None, _ASCII_NOT_LETTERS)))
    _, counts, index = _distinct(text)
    letters = index >= 0
    return float(counts[letters] @ _WEIGHTS[index[letters]])


def text_script(text: str) -> str:
    """The ISO 15924 code of the script holding most of the letters of `text`: one of SCRIPTS (module docstring)."""
    if text.isascii():  # perf: English and code: any ASCII letter is Latin, without counting
        return "Latn" if _ASCII_LETTER.search(text) else COMMON
    points, counts, index = _distinct(text)
    letters = index >= 0
    if not letters.any():
        return COMMON
    raw = np.bincount(index[letters], weights=counts[letters], minlength=len(_CODES))
    kana = sum(raw[_INDEX[k]] for k in KANA)
    han = raw[_INDEX[HAN]] + kana
    weighed = raw * _WEIGHTS
    weighed[_INDEX[HAN]] += sum(weighed[_INDEX[k]] for k in KANA)  # Han and kana compete as one (Japanese is both)
    for k in KANA:
        weighed[_INDEX[k]] = 0
    top = _CODES[int(np.argmax(weighed))]  # ties go to the first script of the table
    if top != HAN:
        return top
    if kana >= KANA_MIN_SHARE * han:  # unweighed: the share of the Han and kana characters
        return JAPANESE
    form = _HAN_FORM[points]
    simplified, traditional = counts[form == 1].sum(), counts[form == 2].sum()
    return SIMPLIFIED if simplified > traditional else TRADITIONAL if traditional > simplified else HAN


# Frequent Han characters that exist in one form only, derived once from OpenCC 1.1's dictionaries (the
# copy in opencc-python-reimplemented 0.1.7, Apache-2.0) and frozen here, so no package is needed to run:
# - SIMPLIFIED_ONLY: the one-character keys of STCharacters.txt (simplified -> traditional) that no
#   traditional spelling uses (not a target of STCharacters or STPhrases, not in TSCharacters or TSPhrases,
#   not in TWVariants, HKVariants or TWPhrases), kept when in GB 2312 level 1 (its 3,755 most frequent
#   characters: Python's gb2312 codec, lead bytes 0xB0-0xD7); 1,217 characters.
# - TRADITIONAL_ONLY: the one-character keys of TSCharacters.txt that no simplified spelling uses (not a
#   target of TSCharacters or TSPhrases, not in STCharacters or STPhrases), kept when in Big5 level 1 (its
#   5,401 frequent characters, 0xA440-0xC67E); 1,766 characters.
# Checked on this machine's gettext catalogs: zh_CN holds 142,121 of the first and 2 of the second, zh_TW 2
# and 90,415, zh_HK 3 and 20,954. Characters both forms share (后, 台, 里, 面, 着, 群) are in neither.
SIMPLIFIED_ONLY = frozenset(
    "与专业丛东丢两严丧个临为丽举义乌乐乔习乡书买乱争亏亚产亩亲亿仅从仑仓仪们众优会伞伟传伤伦伪体侠侣侥侦侧侨侩俩"
    "俭债倾偿储儿兰关兴兹养兽内冈册写军农冯冲决况冻净凄凉减凑凛凤凭凯击凿刘则刚创删刹刽剂剐剑剥劝办务动励劲劳势勋"
    "匀区医华协单卖卢卤卫却厅历厉压厌厕厢厦厨厩县参双发变叙叠号叹吓吕吗吨听启吴呐呕员呛呜咏咙响哑哗哟唤啮啸喷嘘嘱"
    "嚣团园围国图圆圣场坏块坚坛坝坞坟坠垄垒垦垫堑堕墙壮声壳壶处备复够头夹夺奋奖奥妆妇妈娄娇娱婴婶孙学孪宁宝实宠审"
    "宪宽宾寝对寻导寿将尔尘尝尧尽层屉届属屡屿岁岂岗岛岭岿峡峦崭巩币帅师帐帜带帧帮幂并庄庆庐库应庙庞废开异弃张弥弯"
    "弹强归当录彦彻径忆忧怀态怂怜总恋恳恶恼悬悯惊惧惨惩惫惭惮惯愤慑懒战扑执扩扫扬扰抚抛抠抡抢护报担拟拢拣拥拦拧拨"
    "择挚挛挝挞挟挠挡挣挤挥捞损捡换捣掳掷掸掺揽搀搁搂搅携摄摆摇摈摊撑撵擞攒敌敛数斋斩断旧时旷昼显晋晒晓晕暂术机杀"
    "杂权条来杨构枢枣枪枫柠栅标栈栋栏树栖样档桥桨桩梦检椭楼槛横樱橱欢欧歼残殴毁毕毙毡气氢汇汉汤汹沟没沤沥沦沧沪泞"
    "泪泻泼泽洁洒洼浅浆浇浊测济浑浓涛涝涟涡涣涤润涧涨涩渊渍渐渔渗湾湿溃溅滚滞满滤滥滦滨滩潍潜澜濒灭灯灵灾灿炉点炼"
    "炽烁烂烃烛烟烦烧烩烫烬热爱爷牵牺犊状犹狈狞独狭狮狰狱猎猪猫献獭玛环现珐琐琼瑶瓮电画畅畴疗疟疡疮疯痈痉痒痪瘪瘫"
    "癣皑皱盏盐监盖盗盘睁瞒瞩矫矾矿码砖砚砾础硕硷碍碱礼祷祸禄离秃秆积称秽稳穷窃窍窑窜窝窥竖竞笋笔笺笼筛筹签简箩篓"
    "篮篱类粤粪粮紧纠红纤约级纪纫纬纯纱纲纳纵纶纷纸纹纺纽线练组绅细织终绊绍绎经绑绒结绕绘给绚络绝绞统绢绣绥绦继绩"
    "绪续绰绳维绵绷绸综绽绿缀缄缅缆缉缎缓缔缕编缘缚缝缠缨缩缮缴网罗罚罢羡翘耸耻聂聋职联聪肃肠肤肮肾肿胀胁胆胶脉脏"
    "脐脑脓脚脸腻腾舆舰舱艰艳艺节芜芦苇苍苏茎茧荆荡荣荤荧荫药莱莲获莹萝萤营萧萨蒋蓝蓟蔷蔼蕴虏虑虚虱虽虾蚀蚁蚂蚕蛊"
    "蛮蛰蜗蝇蝉衅衔补衬袄袜袭装裤见观规觅视览觉触誉誊计订讣认讥讨让讫训议讯记讲讳讶许讹论讼讽设访诀证评诅识诈诉诊"
    "诌词译试诗诚诛话诞诡询诣该详诧诫诬语误诱诲说诵请诸诺读诽课谁调谅谆谈谊谋谍谎谐谓谗谚谜谢谣谤谦谨谩谬谭谰谱谴"
    "贝贞负贡财责贤败账货质贩贪贫贬购贮贯贰贱贴贵贷贸费贺贼贾贿赁赂赃资赊赋赌赎赏赐赔赖赘赚赛赞赠赡赢赣赵赶趋跃践"
    "踌踪蹿躯车轧轨轩转轮轰轴轻载轿较辅辆辈辉辊辐辑输辕辖辗辙辞辩辫边辽达迁过迈运还这进远违连迟迹选逊递逻遗遥邓邮"
    "邹邻郑郧郸酝酱酿释鉴针钉钎钒钓钙钝钞钟钠钡钢钥钦钧钨钩钮钱钳钵钻钾铀铁铂铃铅铆铜铝铡铣铬铭铰铱铲银铸铺链销锁"
    "锄锅锈锋锌锐锑锗错锚锡锣锤锥锦锨锭键锯锰锹锻镀镁镇镊镍镐镑镜镣镭镰镶长门闪闭问闯闰闲间闷闸闹闺闻闽阀阁阂阅阉"
    "阎阐阑阔队阳阴阵阶际陆陇陈陕陨险随隐隶难雇雏雾霉静韦韧韩韵页顶顷项顺须顽顾顿颁颂预颅领颇颈颊颐频颓颖颗题颜额"
    "颠颤颧风飘飞饥饭饮饯饰饱饲饵饶饺饼饿馁馅馆馈馋馏馒驭驮驯驰驱驳驴驶驹驻驼驾骂骄骆骇骋验骏骑骗骚骡骤鱼鲁鲍鲜鲤"
    "鲸鳃鳖鳞鸟鸡鸣鸥鸦鸭鸯鸳鸵鸽鸿鹃鹅鹊鹏鹤鹰麦齐齿龄龋龙龚龟"
)
TRADITIONAL_ONLY = frozenset(
    "丟並亂亞佇佈佔併侖侶侷係俠倀倆倉個們倖倫偉側偵偽傑傖傘備傭傯傳債傷傾僅僑僕僥僱價儂億儈儉儐儔儕儘償優儲儷儸儻"
    "儼兇兒兗冑冪凍凜刪則剎剛剝剴創剷劃劉劊劍勁動務勛勞勢勣勵勸勻匯匱區協卹卻厭厲參叢吳吶員問啞啟喚喪喫單喲嗆嗇嗎"
    "嗚嗶嘆嘍嘔嘖嘗嘩嘮嘯嘰噓噥噯噴噸噹嚀嚇嚐嚕嚨嚮嚴嚶囀囁囂囈囌囑囪國圍園圓圖團執堊堝堯報場塊塋塒塗塚塢塵塹墊墜"
    "墮墳墾壇壎壓壘壙壞壟壢壩壽夢夾奐奩奪奮妝姍姦娛婁婦媧媼媽嫗嫵嫻嬈嬋嬌嬤嬪嬰嬸孃孫學孿宮寢實寧審寫寬寵寶將專尋"
    "對導尷屆屍屜屢屨屬岡峴島峽崗崙崢嵐嶄嶇嶔嶸嶺嶼巒巔巖師帳帶幀幃幗幟幣幫幹幾庫廁廂廄廈廚廝廟廠廣廬廳弒弔張強彆"
    "彈彌彎彙彥彫彿徑徠復徹恥悅悵悶悽惡惱惻愛愜愴愷愾慄態慍慘慚慟慣慫慮慶慼慾憂憊憐憑憚憤憫憮憲憶懇應懍懣懲懶懷懸"
    "懺懼懾戀戲戶拋挾捨捫捱捲掃掄掙掛採揀揚換揮損搖搗搶摑摟摯摺摻撈撐撓撥撫撲撳撻撾撿擁擄擇擊擋擔據擠擬擰擱擲擴擷"
    "擺擻攆攏攔攙攜攝攣攤攪攬敗敘數斂斃斕斬斷時晉晝暈暉暘暢暫曄曆曇曉曖曠曬朧朮東枴柵桿梔梟棄棗棟棧棲楊楓楨業極榦"
    "榮構槍槨槳樁樅樑樓標樞樣樸樹樺橈橋機橢檔檜檢檣檮檯檳檸檻櫃櫓櫚櫛櫝櫥櫬櫻欄權欐欖歐歟歡歲歷歸歿殤殮殯殲殼毀毆"
    "氈氣氫氬氳汎沒沖況洩洶浹涇涼淒淚淪淵淺渙減渦測渾湊湧湯準溝溫滄滅滌滬滯滲滷滾滿漁漢漣漬漲漸漿潑潔潛潤潯潰澀澆"
    "澗澠澦澱濁濃濕濘濟濫濰濱濺濾瀆瀉瀋瀏瀕瀘瀝瀟瀨瀰瀲瀾灑灘灤災為烏煉煙煥煩煬熒熾燈燉燙燜營燦燬燭燴燻燼燾爍爐爛"
    "爭爺牆牘牽犖犛犢犧狀狹狽猙猶獄獅獎獨獰獲獵獷獸獺獻玀現琺琿瑣瑤瑩瑪璣璦環璽璿瓊瓏瓔瓚甌產甦畝畢畫異當疇疊痙痠"
    "瘋瘍瘓瘡瘧瘺療癆癘癟癢癥癩癬癮癱癲皚皰皺盃盞盡監盤盧盪眾睏睜睞瞞瞼矇矓矚矯硃硯碩確碼磚磧磯礎礙礦礪礫礬祕祿禍"
    "禎禦禪禮禱禿秈稅稈稜稟種稱穀穌積穎穠穡穢穩穫窩窪窮窯窺竄竅竇竊競筆筍筧箇箋箏節範築篤篩簍簑簞簡簣簫簽簾籃籌籟"
    "籠籬籮籲粵糝糞糧糰糾紀紂約紆紇紉紋紐純紕紗紙級紛紜紡紮紱紲紳紹紼絀終絃組絆結絕絛絞絡絢給絨絰統絳絹綁綏經綜綞"
    "綠綢綬維綰綱網綴綵綸綺綻綽綾綿緇緊緒緘緙線緞締緣編緩緬緯緲練緹緻縈縉縊縐縑縛縝縞縣縫縮縯縱縲縴縵縷縹總績繅繆"
    "繈繒織繕繚繞繡繩繪繫繭繳繹繼繽續纏纓纔纖纜缽罈罌罰罵罷羅羈羋羨義羶習翹聖聞聰聲聳聶職聽聾肅脅脈脣脩脫脹腎腦腫"
    "腳腸膚膠膩膽膾膿臉臍臏臘臚臟臢臨臺與興舉舊艙艦艱艷芻茲荊莊莖莧華菴萇萬萵葉葦葷蒞蒼蓀蓆蓋蓮蔔蔣蔥蔭蕩蕪蕭薊薑"
    "薔薦薩薺藍藝藥藪藷藹藺蘆蘇蘊蘋蘚蘭蘿處虛虜號虧蛻蜆蝕蝦蝸螞螢螻蟈蟬蟯蟲蠅蠍蠔蠟蠣蠱蠶蠻術衛衝袞裊補裝裡製複褲"
    "褸褻襖襠襤襪襬襯襲見規覓覦親覬覲覺覽觀觴觸訂訃計訊訌討訏訐訑訓訕訖託記訛訝訟訢訣訥訪設許訴訶診註詁詆詐詔評詖"
    "詛詠詢詣試詫詬詭詮詰話該詳詼誅誇誌認誑誕誘誚誠誡誣誤誥誦誨說誰課誶誹誼調諂諄談諉請諍諒論諛諜諦諧諫諭諮諱諳諶"
    "諷諸諺諼諾謀謁謂謄謊謎謐謗講謝謠謨謫謬譁證譎譏識譙譚譜譟譫譯議譴護譽讀變讒讓讖讚讜豈豎豬貞負財貢貧貨販貪貫責"
    "貯貲貳貴貶貸費貼貽貿賀賁賂賃賄賅資賊賑賒賓賜賞賠賡賣賤賦質賬賭賴賺賻購贅贊贍贏贓贖贗贛趕趙趨踐踴蹕蹟蹣蹤蹺躂"
    "躉躊躋躍躑躓躡躪軀車軋軌軏軒軔軛軸軻軼軾較載輊輒輓輔輕輛輜輝輞輟輥輦輩輪輯輳輸輻輾輿轂轄轅轉轍轎轔轟轡辦辭辮"
    "辯農迴逕這週進遊運過違遙遜遞遠適遲遷選遺遼邁還邇邊邏邐郵鄒鄧鄰鄴酈醃醜醞醫醬醱釀釁釅釋釐釗釘釙針釣釧釩釵鈇鈉"
    "鈍鈐鈑鈔鈕鈞鈣鈴鈷鈸鈹鈽鈾鈿鉀鉅鉉鉋鉍鉑鉗鉚鉛鉤鉸鉻銅銑銓銖銘銜銨銬銳銷銻銼鋁鋅鋇鋒鋤鋪鋰鋸鋼錄錐錕錘錙錚錠"
    "錡錢錦錨錫錮錯錳錶鍊鍋鍍鍔鍚鍛鍥鍬鍰鍵鍾鎂鎊鎔鎖鎘鎚鎢鎬鎰鎳鏃鏈鏍鏑鏗鏘鏜鏝鏟鏡鏢鏤鏨鏽鐃鐘鐫鐮鐲鐳鐵鐸鐺鑄"
    "鑒鑠鑣鑰鑲鑷鑼鑽鑾鑿門閂閃閉閎閏閑閒間閔閘閡閣閤閥閨閩閭閱閻闆闈闊闋闌闐闔闕闖關闡闢陘陝陞陣陰陳陸隊階隕際隨"
    "險隱隴隸隻雋雖雙雛雜雞離難雲電霧霽靂靄靈靦靨鞏鞦韁韃韆韉韌韓韜響頃順頊頌頑頒頓頗頜頡頤頫頭頰頷頸頹頻顆題額顎"
    "顏顓願顛類顥顧顫顯顰顱颯颱颳颶颺颼飄飛飢飩飪飭飯飲飴飼飽飾餃餅餉養餌餒餓餘餚餛餞餡館餵餾餿饅饉饑饒饗饜饞馭馮"
    "馱馳馴駁駐駑駒駕駙駛駝駟駢駭駱駿騁騎騖騙騫騰騵騷騾驀驃驅驍驕驗驚驛驟驢驥驪骯髏體髖髮鬆鬍鬚鬢鬧鬨鬱魎魘魚魯魷"
    "鮑鮪鮫鮭鮮鯀鯉鯊鯖鯛鯧鯨鯽鰍鰓鰥鰭鰱鰻鰾鱉鱔鱖鱗鱟鱷鱸鳥鳩鳳鳴鳶鴃鴆鴉鴒鴕鴛鴣鴦鴨鴿鵑鵝鵠鵡鵪鵬鵲鶉鶯鶴鷂鷓"
    "鷗鷥鷹鷺鸚鸛鸞鹵鹹鹼鹽麗麥麩麴麵黌點黨黴黷鼕鼴齊齋齒齜齟齡齣齦齪齬齲齷龐龔龜"
)

# Code point -> 1 for a character of SIMPLIFIED_ONLY, 2 for one of TRADITIONAL_ONLY, 0 for the rest (1.1 MB).
_HAN_FORM = np.zeros(0x110000, dtype=np.int8)
_HAN_FORM[[ord(c) for c in SIMPLIFIED_ONLY]] = 1
_HAN_FORM[[ord(c) for c in TRADITIONAL_ONLY]] = 2

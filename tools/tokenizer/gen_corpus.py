#!/usr/bin/env python3
"""Deterministic differential-test corpus for the o200k tokenizer.

Writes JSON lines, one document each: {"mode": "ordinary"|"all_special", "text": "..."}.
The same --seed and --mb always give the same file (Python's random.Random is stable across
versions for the calls used here: random(), randrange(), choice()).

Documents mix: prose in ~25 languages and scripts, source code, emoji sequences, whitespace and
digit runs, contractions in odd cases, special-token look-alikes, random Unicode from the whole
range, and every code point in a few contexts (so every code point whose class differs between
Unicode versions, e.g. Python 3.11's 14.0 and the 16.0 of tiktoken's regex, is compared).

  python3 tools/tokenizer/gen_corpus.py --seed 1 --mb 20 --out /tmp/corpus.jsonl
"""
import argparse
import json
import sys

WORDS = {
    "en": "the of and to in is you that it he was for on are as with his they at be this have from or one had by word but not what all were we when your can said there use an each which she do how their if will up other about out many then them these so some her would make like him into time has look two more write go see number no way could people my than first water been call who oil its now find long down day did get come made may part".split(),
    "de": "der die und in den von zu das mit sich des auf für ist im dem nicht ein Die eine als auch es an werden aus er hat daß sie nach wird bei einer Der um am sind noch wie einem über einen Das so Sie zum war haben nur oder aber vor zur bis mehr durch man sein wurde sei Straße Größe Mädchen Übung ärgern öffentlich".split(),
    "fr": "le de un être et à il avoir ne je son que se qui ce dans en du elle au pour pas que vous par sur faire plus dire me on mon lui nous comme mais pouvoir avec tout y aller voir en bien où sans tu ou leur homme si deux mari moi vouloir te femme venir quand grand celui notre devoir là jour prendre même votre rien petit encore aussi quelque dont tout mer trouver donner temps ça peu même falloir sous parler alors sentir savoir déjà être café élève naïve Noël garçon".split(),
    "es": "el la de que y a en un ser se no haber por con su para como estar tener le lo todo pero más hacer o poder decir este ir otro ese la si me ya ver porque dar cuando él muy sin vez mucho saber qué sobre mi alguno mismo yo también hasta año dos querer entre así primero desde grande eso ni nos llegar pasar tiempo ella sí día uno bien poco deber entonces poner cosa tanto hombre parecer nuestro tan donde ahora parte después vida quedar siempre creer hablar llevar dejar nada cada seguir menos nuevo encontrar algo niño mañana año corazón".split(),
    "pt": "não então está você também já ação coração órgão pão irmã avô três mãe português informação".split(),
    "it": "il di che è e la per un in non una sono mi si ho lo ha le ma cosa con perché più città università però già".split(),
    "tr": "ve bir bu da için ile de çok ne gibi daha ama kadar sonra olan İstanbul ığdır şeker güzel öğrenci çalışmak".split(),
    "pl": "się nie że na jest to jak tak za już żeby może być bardzo tylko źródło łódź gęś zażółć jaźń".split(),
    "vi": "của và các có trong được cho là người những với không này một đã theo từ năm đến khi tiếng Việt nhiều".split(),
    "ru": "и в не на я быть он с что а по это она этот к но они мы как из у который то за свой что весь год от так о для ты же все тот мочь вы человек такой его сказать только или ещё бы себя один как уже до время если сам когда другой вот говорить наш мой знать стать при чтобы дело жизнь кто первый очень два день её новый рука даже во со раз где там под можно ну какой после их работа без самый потом надо хотеть ли слово идти большой должен место иметь ничто Москва Россия".split(),
    "uk": "і в на що не з до як це та він але за його від ми по її це ґанок їжак єнот Україна".split(),
    "el": "και το η να του σε με που την της για δεν ο στο είναι θα τα από τον ένα στην μου Αθήνα Ελληνικά ψυχή ωραία ΣΟΦΙΑ".split(),
    "ar": "في من على أن إلى التي الذي عن ما لا هذا مع كان هذه بين قد ذلك كل بعد أو عند الله السلام عليكم العربية مرحبا".split(),
    "he": "של את על לא זה הוא עם גם כי אני היא מה יש אבל כל או היה שלום עברית ירושלים".split(),
    "fa": "و در به از که این را با است برای آن یک خود تا بر هم نیز شده شود فارسی سلام".split(),
    "hi": "के है में की और को से का एक यह पर हैं भी नहीं कि था लिए तो ही या हिन्दी नमस्ते भारत स्वागत क्षत्रिय".split(),
    "bn": "এবং এই একটি করে তার থেকে জন্য সঙ্গে বাংলা নমস্কার".split(),
    "ta": "ஒரு மற்றும் இந்த அது என்று தமிழ் வணக்கம் கல்வி".split(),
    "th": "ที่ การ และ ใน ของ เป็น ได้ มี ไม่ ว่า ให้ จะ ความ ภาษาไทย สวัสดี ครับ ค่ะ".split(),
    "zh": "的 一 是 不 了 人 我 在 有 他 这 中 大 来 上 国 个 到 说 们 为 子 和 你 地 出 道 也 时 年 得 就 那 要 下 以 生 会 自 着 去 之 过 家 学 对 可 她 里 后 小 么 心 多 天 而 能 好 都 然 没 日 于 起 还 发 成 事 只 作 当 想 看 文 无 开 手 十 用 主 行 方 又 如 前 所 本 见 经 头 面 公 同 三 已 老 从 动 两 长 中文 汉字 北京 你好 谢谢".split(),
    "ja": "の に は を た が で て と し れ さ ある いる も する から な こと として い や れる など なっ ない この ため その あっ よう また もの という あり まで られ なる へ か だ これ によって により おり より による ず なり られる において ば なかっ なく しかし について せ だっ その後 できる それ う 日本語 カタカナ ひらがな 東京 ありがとう コンピューター".split(),
    "ko": "이 그 저 것 수 등 때 년 중 사람 우리 한국어 안녕하세요 감사합니다 서울 대한민국".split(),
    "ka": "და არის რომ ეს ქართული გამარჯობა".split(),
    "hy": "և է որ այս հայերեն բարև".split(),
    "am": "እና ነው ይህ አማርኛ ሰላም".split(),
    "my": "သည် နှင့် မြန်မာ မင်္ဂလာပါ".split(),
    "km": "និង ជា នៅ ភាសាខ្មែរ សួស្តី".split(),
}
NO_SPACE = {"zh", "ja", "th", "my", "km"}
PUNCT = [".", ",", "!", "?", ";", ":", "…", "。", "、", "！", "？", "«", "»", "“", "”", "—", "–", "(", ")", "\"", "'", "¿", "¡", "؟", "،", "।"]
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👍🏿", "❤️", "🔥", "🎉", "🚀", "🇺🇸", "🇯🇵", "🇩🇪", "🏳️‍🌈", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🧑‍🤝‍🧑", "✅", "⚠️", "☕", "🐔", "🍕", "1️⃣", "#️⃣", "©️", "™", "🫠", "🪿"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2009", "\u200b", "\u0085", "\u2028", "\u000b", "\u000c", "\u1680", "\u202f", "\u205f", "\u2003"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "０１２３４５６７８９", "ⅠⅡⅢⅣⅤⅥⅦⅧ", "²³¹¼½¾", "①②③④⑤"]
CONTRACTIONS = ["'s", "'S", "'ſ", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'lL", "'d", "'D", "'x", "'r", "'l", "’s", "'"]
SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>", "<|endoftext|>", "<|startoftext|>", "<|endofprompt|>", "<|reserved_200018|>", "<|reserved_200500|>", "<|reserved_201087|>", "<|reserved_201088|>", "<|bogus|>", "<|", "|>", "<|<|end|>", "<|start", "<||>"]
IDENTS = ["x", "i", "value", "count", "get_item", "HTTPServer", "parseJSON", "__init__", "self", "MAX_SIZE", "résumé", "данные", "変数", "_tmp1", "camelCaseName", "snake_case_name", "URLPath", "i18n", "ioError"]
CODE = [
    "def {a}({b}, {c}=None):\n    \"\"\"Docstring for {a}.\"\"\"\n    if {b} is None:\n        return {c}\n    return [{b}[i] ** 2 for i in range(len({b}))]  # squares\n",
    "for (int {a} = 0; {a} < {b}.size(); ++{a}) {{\n\t{c} += {b}[{a}] * 0x1F;\n}}\n",
    "const {a} = async ({b}) => {{ await fetch(`/api/v1/${{{b}}}`); return {c} ?? null; }};\n",
    "{{\"{a}\": [1, 2.5e-3, true, null], \"{b}\": {{\"{c}\": \"\\u00e9\\n\"}}}}\n",
    "<div class=\"{a}\"><a href=\"https://example.com/{b}?q={c}&x=1\">{c}</a></div>\r\n",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {c} >= 42 GROUP BY {a};\n",
    "#!/bin/bash\nfor f in *.txt; do echo \"$f\" | grep -E '^[a-z]+$' >> {a}.log; done\n",
    "    // TODO({a}): fix {b}\n    {c}->next = nullptr;   /* ptr */\n\n\n",
    "fn {a}<'a>({b}: &'a str) -> Result<Vec<u8>, Box<dyn Error>> {{ Ok({b}.bytes().collect()) }}\n",
    "\\begin{{equation}} \\sum_{{{a}=1}}^{{n}} {b}^2 = \\frac{{n(n+1)(2n+1)}}{{6}} \\end{{equation}}\n",
]


def prose(rng, lang, n_words):
    words = WORDS[lang]
    sep = "" if lang in NO_SPACE and rng.random() < 0.7 else " "
    out = []
    for k in range(n_words):
        w = rng.choice(words)
        r = rng.random()
        if r < 0.08:
            w = w.capitalize()
        elif r < 0.10:
            w = w.upper()
        elif r < 0.12:
            w += rng.choice(CONTRACTIONS)
        out.append(w)
        r = rng.random()
        if r < 0.08:
            out.append(rng.choice(PUNCT))
        elif r < 0.10:
            out.append(rng.choice(["\n", "\n\n", "\r\n", " \n"]))
        elif r < 0.11:
            out.append(" " + str(rng.randrange(10 ** rng.randrange(1, 9))))
        out.append(sep)
    return "".join(out)


def code(rng, n):
    out = []
    for _ in range(n):
        t = rng.choice(CODE)
        s = t.format(a=rng.choice(IDENTS), b=rng.choice(IDENTS), c=rng.choice(IDENTS))
        if rng.random() < 0.2:
            s = s.replace("\n", "\r\n")
        if rng.random() < 0.2:
            s = s.replace("    ", "\t")
        out.append(s)
    return "".join(out)


def emoji_text(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            out.append(rng.choice(EMOJI))
        elif r < 0.8:
            out.append(rng.choice(WORDS[rng.choice(list(WORDS))]))
        else:
            out.append(rng.choice(SPACES[:4]))
    return "".join(out)


def whitespace_stress(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.45:
            out.append("".join(rng.choice(SPACES) for _ in range(rng.randrange(1, 40))))
        elif r < 0.7:
            out.append(rng.choice(WORDS["en"]) if rng.random() < 0.7 else rng.choice(WORDS[rng.choice(list(WORDS))]))
        elif r < 0.85:
            out.append(rng.choice(PUNCT + ["{", "}", "/", "//", "/*", "->", "::", "==="]))
        else:
            out.append(str(rng.randrange(1000)))
    return "".join(out)


def digit_runs(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            out.append(str(rng.randrange(10 ** rng.randrange(1, 60))))
        elif r < 0.6:
            ds = rng.choice(DIGITS)
            out.append("".join(rng.choice(ds) for _ in range(rng.randrange(1, 30))))
        elif r < 0.8:
            out.append(f"{rng.randrange(10**6):,}.{rng.randrange(100):02d}")
        else:
            out.append(rng.choice([" ", "  ", "\n", "-", "+", "x", "abc", "$", "%", "e", "E+", "٫"]))
    return "".join(out)


def random_code_point(rng):
    r = rng.random()
    if r < 0.3:
        cp = rng.randrange(0x20, 0x3000)
    elif r < 0.6:
        cp = rng.randrange(0x3000, 0x30000)
    elif r < 0.7:
        cp = rng.randrange(0, 0x110000)
    elif r < 0.85:
        cp = rng.choice([0x0300, 0x0301, 0x0308, 0x0327, 0x093F, 0x0E31, 0x200D, 0xFE0F, 0x01C5, 0x01C8, 0x1F88, 0x02B0, 0x3005, 0x0345])
    else:
        cp = rng.randrange(0x20, 0x80)
    if 0xD800 <= cp < 0xE000:
        cp = 0xFFFD
    return chr(cp)


def random_unicode(rng, n):
    out = []
    for _ in range(n):
        out.append(random_code_point(rng))
        r = rng.random()
        if r < 0.1:
            out.append(" ")
        elif r < 0.12:
            out.append(rng.choice(CONTRACTIONS))
    return "".join(out)


def specials(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            out.append(rng.choice(SPECIALS))
        elif r < 0.8:
            out.append(prose(rng, rng.choice(list(WORDS)), rng.randrange(1, 8)))
        else:
            out.append(rng.choice(SPACES[:6]))
    return "".join(out)


def long_words(rng):
    lang = rng.choice(["zh", "ja", "th", "en", "ru", "ar"])
    words = WORDS[lang]
    w = "".join(rng.choice(words) for _ in range(rng.randrange(20, 400)))
    return w if rng.random() < 0.5 else " " + w + rng.choice(["", " ", "'s", "\n"])


def every_code_point_docs(per_doc=4000):
    """Every code point below U+40000 (all assigned ones but plane 14) and all of plane 14 in a few
    contexts; planes 4-13 and 15-16 (unassigned or private use) sampled every 7th code point."""
    dense = [cp for cp in range(0x40000) if not 0xD800 <= cp < 0xE000] + list(range(0xE0000, 0xE1000))
    sparse = [cp for cp in range(0x40000, 0x110000, 7) if not 0xE0000 <= cp < 0xE1000]
    docs = []
    for i in range(0, len(dense), per_doc):
        docs.append("".join(f"a{chr(cp)} {chr(cp)}B 1{chr(cp)}'{chr(cp)}\n" for cp in dense[i:i + per_doc]))
    for i in range(0, len(sparse), per_doc):
        docs.append("".join(f" {chr(cp)}a" for cp in sparse[i:i + per_doc]))
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mb", type=float, default=20.0, help="approximate size of the random part, in MB")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-every-code-point", action="store_true", help="skip the all-code-points documents")
    args = ap.parse_args()

    import random

    rng = random.Random(args.seed)
    target = int(args.mb * 1e6)
    docs = []
    total = 0
    kinds = ["prose"] * 10 + ["code"] * 3 + ["emoji", "whitespace", "whitespace", "digits", "digits", "random", "random", "specials", "long"]
    while total < target:
        kind = rng.choice(kinds)
        mode = "ordinary"
        if kind == "prose":
            text = prose(rng, rng.choice(list(WORDS)), rng.randrange(20, 3000))
        elif kind == "code":
            text = code(rng, rng.randrange(1, 60))
        elif kind == "emoji":
            text = emoji_text(rng, rng.randrange(10, 1500))
        elif kind == "whitespace":
            text = whitespace_stress(rng, rng.randrange(10, 1500))
        elif kind == "digits":
            text = digit_runs(rng, rng.randrange(10, 1500))
        elif kind == "random":
            text = random_unicode(rng, rng.randrange(10, 4000))
        elif kind == "specials":
            text = specials(rng, rng.randrange(5, 400))
            mode = "all_special" if rng.random() < 0.7 else "ordinary"
        else:
            text = long_words(rng)
        docs.append((mode, text))
        total += len(text.encode("utf-8"))
    if not args.no_every_code_point:
        docs += [("ordinary", d) for d in every_code_point_docs()]
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for mode, text in docs:
            f.write(json.dumps({"mode": mode, "text": text}, ensure_ascii=False))
            f.write("\n")
    size = sum(len(t.encode("utf-8")) for _, t in docs)
    print(f"{len(docs)} documents, {size / 1e6:.1f} MB of text -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

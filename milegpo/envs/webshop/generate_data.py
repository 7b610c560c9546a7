"""Generate the bundled WebShop catalog and instruction sets (deterministic, seeded).

The real WebShop product files (1.18M scraped products, 12,087 human
instructions) are a download this project cannot rely on. This script writes a
small catalog of our own in **upstream's JSON layouts**, so the same loader
reads the bundled files and the full download:

``items_shuffle.json``
    list of products: ``asin``, ``name``, ``category``, ``query``,
    ``product_category`` (``"A › B › C"``), ``full_description``,
    ``small_description`` (bullet points), ``pricing`` (``"$12.99"`` or
    ``"$10.99 - $19.99"``), ``customization_options``
    (``{"Color": [{"value": ..., "image": ...}]}``), ``images``.
``items_ins_v2.json``
    ``{asin: {"attributes", "instruction", "instruction_attributes"}}``
    (the product's attributes and one synthetic instruction).
``items_human_ins.json``
    ``{asin: [{"asin", "instruction", "instruction_attributes", "instruction_options"}]}``
    (the "human" instructions; here written from templates).

The catalog has 5 categories (upstream's beauty, electronics, fashion,
furniture, grocery) x 4 product types x ``products_per_type`` products. Products
of one type share a query and a category path and differ in brand, attributes,
options and price, so an instruction is only satisfied by reading the results
and choosing options, as on the real site.

Run ``python -m milegpo.envs.webshop.generate_data [--out DIR] [--seed N]``;
the committed files under ``data/`` are its output with the defaults.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).parent / "data"

# One entry per product type: the scrape query, the category path, the noun
# used in titles/instructions, the attribute pool, the option groups and the
# price range in dollars.
PRODUCT_TYPES: dict[str, list[dict[str, Any]]] = {
    "fashion": [
        dict(query="men's t-shirts", noun="t-shirt",
             path="Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
             attrs=["machine wash", "cotton", "short sleeve", "slim fit", "crew neck", "moisture wicking",
                    "long sleeve", "classic fit"],
             options={"Color": ["black", "white", "navy blue", "heather grey", "red", "olive green", "royal blue"],
                      "Size": ["small", "medium", "large", "x-large", "xx-large"]},
             price=(9, 35), extra=["for Men", "Casual Tee", "Athletic Shirt", "Everyday Top"]),
        dict(query="women's running shoes", noun="running shoes",
             path="Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
             attrs=["non slip", "rubber sole", "lightweight", "breathable mesh", "memory foam", "arch support",
                    "lace up"],
             options={"Color": ["black", "white", "pink", "grey", "purple", "teal"],
                      "Size": ["6", "6.5", "7", "7.5", "8", "8.5", "9", "10"]},
             price=(25, 90), extra=["for Women", "Walking Sneakers", "Gym Trainers", "Tennis Shoes"]),
        dict(query="women's dresses", noun="dress",
             path="Clothing, Shoes & Jewelry › Women › Clothing › Dresses › Casual",
             attrs=["machine wash", "polyester spandex", "long sleeve", "v-neck", "high waist", "pockets",
                    "elastic waist"],
             options={"Color": ["black", "floral blue", "wine red", "green", "apricot", "leopard"],
                      "Size": ["small", "medium", "large", "x-large"]},
             price=(18, 60), extra=["for Women", "Summer Sundress", "Midi Dress", "Party Dress"]),
        dict(query="men's jeans", noun="jeans",
             path="Clothing, Shoes & Jewelry › Men › Clothing › Jeans",
             attrs=["straight leg", "relaxed fit", "button closure", "machine wash", "stretch denim", "slim fit"],
             options={"Color": ["dark wash", "light wash", "black", "medium indigo", "stonewash"],
                      "Size": ["30w x 30l", "32w x 30l", "32w x 32l", "34w x 32l", "36w x 32l"]},
             price=(20, 70), extra=["for Men", "Denim Pants", "Classic Jeans", "Work Jeans"]),
    ],
    "beauty": [
        dict(query="shampoo", noun="shampoo",
             path="Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
             attrs=["sulfate free", "paraben free", "natural ingredients", "dry hair", "hair growth",
                    "cruelty free", "argan oil"],
             options={"Scent": ["lavender", "coconut", "unscented", "tea tree", "citrus"],
                      "Size": ["8.5 fl oz", "16.9 fl oz", "33.8 fl oz"]},
             price=(6, 40), extra=["for Women and Men", "Daily Cleanser", "Salon Formula", "Hair Wash"]),
        dict(query="lipstick", noun="lipstick",
             path="Beauty & Personal Care › Makeup › Lips › Lipstick",
             attrs=["long lasting", "cruelty free", "matte finish", "paraben free", "highly pigmented",
                    "moisturizing"],
             options={"Color": ["ruby red", "nude pink", "berry", "coral", "mauve", "classic red"],
                      "Size": ["1 count", "2 count", "3 count"]},
             price=(5, 28), extra=["Lip Color", "Velvet Lipstick", "Makeup Set", "Lip Stain"]),
        dict(query="hair extensions", noun="hair extensions",
             path="Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Extensions",
             attrs=["natural looking", "clip in", "heat resistant", "easy to use", "synthetic hair",
                    "human hair"],
             options={"Color": ["dark brown", "light brown", "blonde", "black", "ash blonde"],
                      "Size": ["16 inch", "18 inch", "20 inch", "22 inch"]},
             price=(15, 80), extra=["for Women", "Straight Hairpiece", "Wavy Hairpiece", "Full Head Set"]),
        dict(query="face moisturizer", noun="face moisturizer",
             path="Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
             attrs=["hyaluronic acid", "fragrance free", "dry skin", "sensitive skin", "oil free", "anti aging",
                    "spf 30"],
             options={"Size": ["1.7 oz", "2.5 oz", "3.4 oz"]},
             price=(9, 55), extra=["Day Cream", "Night Cream", "Facial Lotion", "Hydrating Gel"]),
    ],
    "grocery": [
        dict(query="ground coffee", noun="ground coffee",
             path="Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
             attrs=["medium roast", "dark roast", "organic", "fair trade", "non gmo", "gluten free",
                    "kosher certified"],
             options={"Flavor Name": ["french vanilla", "hazelnut", "original", "caramel", "mocha"],
                      "Size": ["12 ounce", "24 ounce", "2 pound"]},
             price=(7, 35), extra=["Bag", "Breakfast Blend", "Arabica Coffee", "House Blend"]),
        dict(query="protein bars", noun="protein bars",
             path="Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
             attrs=["gluten free", "low sugar", "high protein", "keto friendly", "non gmo", "plant based"],
             options={"Flavor Name": ["chocolate peanut butter", "cookies and cream", "almond", "birthday cake",
                                      "lemon"],
                      "Size": ["12 count", "15 count", "24 count"]},
             price=(14, 45), extra=["Snack Bars", "Energy Bars", "Variety Pack", "Meal Replacement"]),
        dict(query="herbal tea", noun="herbal tea",
             path="Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Herbal",
             attrs=["caffeine free", "organic", "individually wrapped", "non gmo", "kosher certified",
                    "gluten free"],
             options={"Flavor Name": ["chamomile", "peppermint", "ginger", "hibiscus", "lemon balm"],
                      "Size": ["20 count", "40 count", "100 count"]},
             price=(4, 25), extra=["Tea Bags", "Wellness Tea", "Loose Leaf", "Sampler"]),
        dict(query="mixed nuts", noun="mixed nuts",
             path="Grocery & Gourmet Food › Snack Foods › Nuts & Seeds › Mixed Nuts",
             attrs=["low sodium", "roasted", "resealable bag", "non gmo", "high protein", "gluten free"],
             options={"Flavor Name": ["sea salt", "honey roasted", "unsalted", "smoked"],
                      "Size": ["16 ounce", "2 pound", "3 pound"]},
             price=(8, 40), extra=["Snack Mix", "Deluxe Nuts", "Party Pack", "Trail Snack"]),
    ],
    "electronics": [
        dict(query="bluetooth headphones", noun="headphones",
             path="Electronics › Headphones, Earbuds & Accessories › Headphones › Over-Ear Headphones",
             attrs=["noise cancelling", "wireless bluetooth", "long battery life", "hands free",
                    "built-in microphone", "foldable", "fast charging"],
             options={"Color": ["black", "white", "silver", "midnight blue", "rose gold"]},
             price=(20, 200), extra=["Over Ear", "Studio Headset", "Travel Headphones", "Hi-Fi Stereo"]),
        dict(query="phone case", noun="phone case",
             path="Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
             attrs=["shockproof", "slim fit", "wireless charging compatible", "scratch resistant",
                    "tempered glass", "kickstand"],
             options={"Color": ["black", "clear", "navy blue", "pink", "green"],
                      "Size": ["iphone 13", "iphone 14", "iphone 14 pro", "galaxy s22", "galaxy s23"]},
             price=(7, 30), extra=["Protective Cover", "Bumper Case", "Rugged Case", "Thin Case"]),
        dict(query="usb c cable", noun="usb c cable",
             path="Electronics › Computers & Accessories › Cables & Accessories › Cables › USB Cables",
             attrs=["fast charging", "braided nylon", "high speed data transfer", "durable", "tangle free"],
             options={"Color": ["black", "white", "red", "grey"],
                      "Size": ["3 ft", "6 ft", "10 ft"]},
             price=(6, 20), extra=["Charger Cord", "Charging Cable", "Sync Cable", "2 Pack"]),
        dict(query="portable bluetooth speaker", noun="bluetooth speaker",
             path="Electronics › Portable Audio & Video › Portable Speakers & Docks › Portable Bluetooth Speakers",
             attrs=["waterproof", "wireless bluetooth", "long battery life", "portable", "stereo sound",
                    "hands free"],
             options={"Color": ["black", "blue", "red", "camo", "grey"]},
             price=(18, 120), extra=["Outdoor Speaker", "Party Speaker", "Mini Speaker", "Loud Bass"]),
    ],
    "furniture": [
        dict(query="office chair", noun="office chair",
             path="Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs › Desk Chairs",
             attrs=["lumbar support", "height adjustable", "easy assemble", "mesh back", "swivel", "pu leather",
                    "heavy duty"],
             options={"Color": ["black", "grey", "white", "blue", "pink"]},
             price=(60, 300), extra=["Ergonomic Desk Chair", "Task Chair", "Executive Chair", "Computer Chair"]),
        dict(query="bookshelf", noun="bookshelf",
             path="Home & Kitchen › Furniture › Home Office Furniture › Bookcases",
             attrs=["easy assemble", "solid wood", "space saving", "storage space", "engineered wood",
                    "mid century"],
             options={"Color": ["walnut", "white", "black", "espresso", "natural oak"],
                      "Size": ["3-tier", "4-tier", "5-tier"]},
             price=(40, 200), extra=["Bookcase", "Display Shelf", "Storage Rack", "Open Shelving Unit"]),
        dict(query="end table", noun="end table",
             path="Home & Kitchen › Furniture › Living Room Furniture › Tables › End Tables",
             attrs=["easy assemble", "living room", "storage space", "metal frame", "engineered wood",
                    "space saving"],
             options={"Color": ["rustic brown", "black", "white", "grey"]},
             price=(25, 120), extra=["Side Table", "Nightstand", "Sofa Table", "Accent Table"]),
        dict(query="bed sheet set", noun="sheet set",
             path="Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
             attrs=["machine washable", "deep pocket", "wrinkle free", "breathable", "microfiber",
                    "hypoallergenic"],
             options={"Color": ["white", "grey", "navy blue", "sage green", "beige"],
                      "Size": ["twin", "full", "queen", "king"]},
             price=(20, 90), extra=["4 Piece Bedding", "Bed Sheets", "Cooling Sheets", "Soft Sheets"]),
    ],
}

BRANDS = ["Arlo", "Bexley", "Corvana", "Dunmore", "Elkwood", "Fairhaven", "Glenrock", "Halvery", "Ivelle",
          "Juniper & Co", "Kestrel", "Lumera", "Marlowe", "Northvale", "Orrin", "Pellham", "Quillon", "Rowan",
          "Solace", "Tidewell", "Umbra Lane", "Verano", "Westbrook", "Yarrow", "Zephyra"]

DESCRIPTION_TEMPLATES = [
    "This {noun} from {brand} is made to last. It is {a0} and {a1}, a dependable choice for every day.",
    "Meet the {brand} {noun}: {a0}, {a1} and designed with care. Satisfaction guaranteed.",
    "Our {noun} combines quality and value. Key features: {a0}; {a1}. Order yours today.",
    "{brand} has designed this {noun} for people who want more. Enjoy a product that is {a0} and {a1}.",
]

INSTRUCTION_TEMPLATES = [
    "i am looking for {attrs} {noun}{opts}",
    "i need {attrs} {noun}{opts}",
    "find me {attrs} {noun}{opts}",
    "i want to buy {attrs} {noun}{opts}",
    "i'm looking for {noun} that is {attrs}{opts}",
]


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _and_join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _option_phrase(name: str, value: str) -> str:
    name = name.lower().replace("flavor name", "flavor")
    return f"{value} {name}" if name in ("color", "flavor", "scent") else f"size {value}"


def _product(rng: random.Random, category: str, spec: dict[str, Any], asin: str, titles: set[str]) -> dict[str, Any]:
    while True:  # titles are unique, as a shopper can tell products apart by them
        brand = rng.choice(BRANDS)
        attrs = rng.sample(spec["attrs"], rng.randint(3, min(5, len(spec["attrs"]))))
        title = f"{brand} {attrs[0].title()} {spec['noun'].title()} {rng.choice(spec['extra'])}"
        if rng.random() < 0.5:
            title += f", {attrs[1].title()}"
        if title not in titles:
            titles.add(title)
            break
    options = {
        name: sorted(rng.sample(values, rng.randint(min(3, len(values)), len(values))), key=values.index)
        for name, values in spec["options"].items()
    }
    low, high = spec["price"]
    price = round(rng.uniform(low, high), 2)
    if rng.random() < 0.2:
        pricing = f"${price:.2f} - ${price * rng.uniform(1.1, 1.5):.2f}"
    else:
        pricing = f"${price:.2f}"
    description = rng.choice(DESCRIPTION_TEMPLATES).format(noun=spec["noun"], brand=brand, a0=attrs[0], a1=attrs[-1])
    bullets = [f"{a.upper()}: {brand} {spec['noun']} that is {a}." for a in attrs[1:]]
    bullets.append(f"WHAT YOU GET: one {spec['noun']} and our friendly customer service.")
    return {
        "asin": asin,
        "name": title,
        "category": category,
        "query": spec["query"],
        "product_category": spec["path"],
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "customization_options": {
            name: [{"value": v, "image": None} for v in values] for name, values in options.items()
        } or None,
        "images": [f"https://example.invalid/webshop/{asin}.jpg"],
        "average_rating": None,
    }


def _instruction(rng: random.Random, spec: dict[str, Any], attrs: list[str], options: dict[str, list[str]],
                 with_options: bool) -> dict[str, Any]:
    chosen_attrs = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
    chosen_options: list[str] = []
    phrases: list[str] = []
    if with_options:
        for name, values in options.items():
            if rng.random() < 0.85:
                value = rng.choice(values)
                chosen_options.append(value)
                phrases.append(_option_phrase(name, value))
    opts = (" in " + _and_join(phrases)) if phrases else ""
    text = rng.choice(INSTRUCTION_TEMPLATES).format(attrs=_and_join(chosen_attrs), noun=spec["noun"], opts=opts)
    return {"instruction": text, "instruction_attributes": chosen_attrs, "instruction_options": chosen_options}


def generate(seed: int = 0, products_per_type: int = 20) -> tuple[list, dict, dict]:
    """Build (items_shuffle, items_ins_v2, items_human_ins) in upstream's layouts."""
    rng = random.Random(seed)
    taken: set[str] = set()
    titles: set[str] = set()
    products, ins_v2, human = [], {}, {}
    for category, specs in PRODUCT_TYPES.items():
        for spec in specs:
            for _ in range(products_per_type):
                asin = _asin(rng, taken)
                product = _product(rng, category, spec, asin, titles)
                text = " ".join([product["name"], product["full_description"], *product["small_description"]]).lower()
                attrs = [a for a in spec["attrs"] if a in text]  # the attributes the product's text shows
                options = {n: [c["value"] for c in vs] for n, vs in (product["customization_options"] or {}).items()}
                synthetic = _instruction(rng, spec, attrs, options, with_options=False)
                ins_v2[asin] = {"attributes": attrs, "instruction": synthetic["instruction"],
                                "instruction_attributes": synthetic["instruction_attributes"]}
                n_human = rng.choices([0, 1, 2], weights=[1, 5, 3])[0]
                human_ins = [_instruction(rng, spec, attrs, options, with_options=True) for _ in range(n_human)]
                if human_ins:
                    human[asin] = [{"asin": asin, **ins} for ins in human_ins]
                products.append(product)
    rng.shuffle(products)  # upstream's product file is shuffled too ("items_shuffle")
    return products, ins_v2, human


def write(out: Path, seed: int = 0, products_per_type: int = 20) -> None:
    """Write the three JSON files into ``out``."""
    products, ins_v2, human = generate(seed, products_per_type)
    out.mkdir(parents=True, exist_ok=True)
    for name, obj in (("items_shuffle.json", products), ("items_ins_v2.json", ins_v2),
                      ("items_human_ins.json", human)):
        (out / name).write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--products-per-type", type=int, default=20)
    args = parser.parse_args(argv)
    write(args.out, args.seed, args.products_per_type)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

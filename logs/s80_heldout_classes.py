"""Stop 80: four more held-out prompt classes for checking the default method (written for the project; never used
for training or tuning): python logs/s80_heldout_classes.py

- long_doc.jsonl: a long document (a README from an installed package's metadata, cut to ~6,000 characters at a
  paragraph) with a question about it: long prompts, short answers.
- structured.jsonl: JSON, CSV and Markdown tables from a description (answers with a regular shape).
- multilingual.jsonl: free writing in French, Spanish, German, Italian, Portuguese and Dutch (not translation).
- enumerate.jsonl: lists with a repeating pattern (tables, schedules, sequences).
"""
import json
from importlib import metadata
from pathlib import Path

OUT = Path("data/heldout")
DOCS = [("requests", "Write a short summary of this project for a newcomer: what it does, how to install it, and one "
         "example of using it."),
        ("rich", "Which features of this library would help someone who writes command-line tools? List four, one "
         "sentence each."),
        ("fastapi", "According to this document, what are the main advantages of the framework? Answer in a short "
         "paragraph."),
        ("pydantic", "Explain to a beginner what this library is for and give a small example in your own words."),
        ("typer", "Summarise this document in five bullet points."),
        ("tqdm", "What does this library do, and how would you add it to an existing for loop? Answer briefly."),
        ("httpx", "Compare what this document says about the library with what you know of other HTTP clients, in "
         "one paragraph."),
        ("networkx", "Write three questions a new user might ask after reading this, and answer each one from the "
         "document.")]
STRUCTURED = [
    "Write a JSON array of six objects describing fruits, each with the keys name, colour, average_weight_grams and "
    "season.",
    "Create a CSV file with a header row and ten rows of made-up employees: id, first_name, last_name, department, "
    "start_year, salary.",
    "Make a Markdown table of the planets of the solar system with columns for name, position from the sun, number of "
    "moons and whether it has rings.",
    "Return a JSON object describing a small library: its name, address, opening hours for each day of the week, and "
    "a list of four books with title, author and year.",
    "Write a YAML configuration file for a web service with sections for server (host, port, workers), database "
    "(url, pool size, timeout) and logging (level, file, rotation).",
    "Produce a Markdown table comparing five programming languages by typing discipline, main use, year created and "
    "creator.",
    "Give me a JSON list of eight cities with their country, population (approximate) and a famous landmark.",
    "Write an HTML table listing a weekly gym schedule: the days Monday to Sunday, the class name, the time and the "
    "instructor.",
]
MULTILINGUAL = [
    "Écris un court texte sur ce que tu aimes faire le dimanche matin.",
    "Escribe una carta breve a un amigo contándole tus últimas vacaciones en la playa.",
    "Schreibe einen kurzen Text darüber, warum Fahrradfahren in der Stadt gut für die Gesundheit ist.",
    "Scrivi una breve descrizione della tua città ideale.",
    "Escreva um pequeno texto sobre a importância de ler livros para as crianças.",
    "Schrijf een korte tekst over je favoriete seizoen en waarom je het leuk vindt.",
    "Donne trois conseils pour bien dormir et explique chacun en deux phrases.",
    "Explica en un párrafo cómo preparar una tortilla de patatas.",
]
ENUMERATE = [
    "Write the multiplication table of 7 from 7 x 1 to 7 x 20, one line each.",
    "List the months of the year, each with its number of days and the season it falls in (northern hemisphere).",
    "Write a study schedule for a week: for each day from Monday to Sunday, give a morning, afternoon and evening "
    "subject.",
    "List the first 25 square numbers in the form 'n squared is m'.",
    "For each letter of the alphabet from A to Z, give one animal whose name starts with it.",
    "Write a countdown from 30 to 1 where each line says the number and whether it is even or odd.",
    "List twelve common kitchen tools, each followed by a dash and what it is used for.",
    "Write the steps of a 20-minute workout as a numbered list with the exercise and its duration.",
]


def readme(dist: str, limit: int = 6000) -> str:
    text = metadata.metadata(dist).get_payload() or metadata.metadata(dist).get("Description") or ""
    text = text.strip()
    if len(text) > limit:
        cut = text.rfind("\n\n", 0, limit)
        text = text[: cut if cut > limit // 2 else limit]
    return text


def write(name: str, category: str, turns: list[str]) -> None:
    with open(OUT / name, "w") as f:
        for i, t in enumerate(turns):
            f.write(json.dumps({"question_id": i, "category": category, "turns": [t]}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    docs = []
    for dist, question in DOCS:
        body = readme(dist)
        if len(body) < 2000:
            raise SystemExit(f"{dist}: README too short ({len(body)} characters)")
        docs.append(f"Here is the README of a software project.\n\n{body}\n\n{question}")
    write("long_doc.jsonl", "long_doc", docs)
    write("structured.jsonl", "structured", STRUCTURED)
    write("multilingual.jsonl", "multilingual", MULTILINGUAL)
    write("enumerate.jsonl", "enumerate", ENUMERATE)
    for name in ("long_doc.jsonl", "structured.jsonl", "multilingual.jsonl", "enumerate.jsonl"):
        print(name, len((OUT / name).read_text().splitlines()), "prompts")

"""Assemble chat-style training prompts for self-distillation, from packages that install offline.

The target model answers these prompts and a draft head learns from the answers, so the prompts should look
like what a chat assistant is asked: writing and roleplay, open chat, knowledge questions and reasoning, math
word problems, code, summarization, extraction and rewriting. Run it with ``drafttree data prompts``.

Sources (fetched with ``pip download --no-deps`` into a cache folder and read straight from the archives,
never installed):

* PyPI ``inspect-evals`` 0.26.0 (MIT): WritingBench's English prompts, PersistBench user queries, FreshQA
  questions.
* PyPI ``evals`` 3.0.1.post1 (MIT code, data from many contributors): chat-format registry data (math sets
  that are not GSM8K, logiqa, QuaRTz, Social IQa, medmcqa, tort law, extraction tasks, ...), OpenWebText,
  Wikipedia and C4 passages, research abstracts, quotes, a noun lexicon.
* Seeded templates: grade-school math word problems (shopping, rates, percentages, fractions, ages, work,
  recipes, geometry, units, averages, ...), open-ended chat requests (advice, planning, comparisons, opinions,
  role-play, small talk), knowledge questions, writing prompts built around word sets, and general coding
  requests in several languages.
* The Python standard library sources of the running interpreter: functions turned into code prompts, and
  single interesting lines turned into "what does this line do?" prompts.

BIG-bench is NOT used by default. Every BIG-bench task file carries a canary string asking that its data never
appear in training corpora, and we honour that. ``include_bigbench=True`` (CLI ``--include-bigbench``) brings
back the old BIG-bench sources (topical_chat, MathQA, StrategyQA, TruthfulQA, XSum, WikiLingua, CommonGen,
...) from the PyPI ``bigbench`` 1.0.0 sdist; using it knowingly ignores that canary request.

Each prompt's id is ``"<source>:<hash of the prompt text>"``, so re-running gives the same ids whatever the
order the sources are read in.

Evaluation questions (MT-bench, HumanEval, GSM8K, Alpaca, CNN/DailyMail, Natural Questions) must never be
trained on: every candidate is checked against the question files in ``bench_dir`` and dropped when it
equals or contains a benchmark question, or shares a run of 13 words with one.

Layout: the wording (templates, word and topic lists, the word problems, weights and source lists) is in the
JSON files of ``data/``, written in the small template language of :mod:`.engine` (text helpers in
:mod:`.helpers`). :mod:`.core` holds the records, the data loader and the text helpers; :mod:`.generated`
runs the seeded templates; :mod:`.builders` and :mod:`.pycode` turn source records into candidates;
:mod:`.sources` fetches and reads the archives; :mod:`.mixing` filters and mixes; :mod:`.assemble` ties it
all together.
"""

from drafttree.train.prompts.assemble import assemble_prompts, collect_bigbench, collect_candidates
from drafttree.train.prompts.builders import (
    GRIM_NOUNS,
    build_abstract_summaries,
    build_bigbench_questions,
    build_common_gen,
    build_concept_sets,
    build_evals_set,
    build_freshqa,
    build_mathqa,
    build_persistbench,
    build_rewrites,
    build_summaries,
    build_topical_chat,
    build_writing_templates,
    build_writingbench,
    clean_mathqa,
    evals_prompt,
    looks_concrete,
    strip_answer_format,
)
from drafttree.train.prompts.core import (
    BIGBENCH_TASKS,
    BIGBENCH_VERSION,
    CATEGORY_WEIGHTS,
    EVALS_SETS,
    MAX_PASSAGE_CHARS,
    MAX_PROMPT_CHARS,
    MIN_PROMPT_CHARS,
    PACKAGES,
    SOURCE_WEIGHTS,
    Candidate,
    cap_length,
    clean_candidates,
    cut_passage,
    is_english,
    load_data,
    normalize_text,
    to_record,
    word_tokens,
)
from drafttree.train.prompts.engine import TemplateError
from drafttree.train.prompts.generated import (
    WORD_PROBLEM_TEMPLATES,
    WordProblem,
    build_chat_prompts,
    build_code_requests,
    build_knowledge_questions,
    build_word_problems,
)
from drafttree.train.prompts.mixing import (
    OVERLAP_NGRAM,
    BenchIndex,
    allocate,
    default_bench_dirs,
    filter_overlaps,
    mix,
    read_bench_questions,
    select_prompts,
    summarize,
    write_jsonl,
)
from drafttree.train.prompts.pycode import (
    PyFunction,
    build_code_line_prompts,
    build_code_prompts,
    code_prompt,
    extract_functions,
    stdlib_functions,
)
from drafttree.train.prompts.sources import (
    BIGBENCH_SUBSET,
    default_sources_dir,
    fetch_bigbench,
    fetch_package,
    read_bigbench,
)

__all__ = [
    "BIGBENCH_SUBSET", "BIGBENCH_TASKS", "BIGBENCH_VERSION", "CATEGORY_WEIGHTS", "EVALS_SETS", "GRIM_NOUNS",
    "MAX_PASSAGE_CHARS", "MAX_PROMPT_CHARS", "MIN_PROMPT_CHARS", "OVERLAP_NGRAM", "PACKAGES", "SOURCE_WEIGHTS",
    "WORD_PROBLEM_TEMPLATES", "BenchIndex", "Candidate", "PyFunction", "TemplateError", "WordProblem",
    "allocate", "assemble_prompts", "build_abstract_summaries", "build_bigbench_questions", "build_chat_prompts",
    "build_code_line_prompts", "build_code_prompts", "build_code_requests", "build_common_gen",
    "build_concept_sets", "build_evals_set", "build_freshqa", "build_knowledge_questions", "build_mathqa",
    "build_persistbench", "build_rewrites", "build_summaries", "build_topical_chat", "build_word_problems",
    "build_writing_templates", "build_writingbench", "cap_length", "clean_candidates", "clean_mathqa",
    "code_prompt", "collect_bigbench", "collect_candidates", "cut_passage", "default_bench_dirs",
    "default_sources_dir", "evals_prompt", "extract_functions", "fetch_bigbench", "fetch_package",
    "filter_overlaps", "is_english", "load_data", "looks_concrete", "mix", "normalize_text", "read_bench_questions",
    "read_bigbench", "select_prompts", "stdlib_functions", "strip_answer_format", "summarize", "to_record",
    "word_tokens", "write_jsonl",
]

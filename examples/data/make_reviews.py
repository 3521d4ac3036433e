#!/usr/bin/env python3
"""Writes the quick start's small made-up review data (reviews_train.csv, reviews_dev.csv,
reviews_new.csv): one-sentence reviews whose label, positive or negative, is what their words
say. Deterministic; run from this directory to rewrite the committed files."""
import csv
import random

rng = random.Random(7)
things = ["film", "movie", "book", "album", "restaurant", "hotel", "phone", "laptop", "game",
          "show", "play", "camera", "coffee", "bakery", "museum", "novel", "song", "course"]
good = ["wonderful", "excellent", "delightful", "brilliant", "charming", "superb", "great",
        "lovely", "fantastic", "moving", "clever", "fresh", "beautiful", "enjoyable"]
bad = ["terrible", "awful", "boring", "dreadful", "dull", "disappointing", "poor", "bland",
       "tedious", "annoying", "broken", "clumsy", "ugly", "forgettable"]
openers = ["the {t} was {a}", "what a {a} {t}", "this {t} is {a}", "i found the {t} {a}",
           "honestly, a {a} {t}", "our {t} turned out {a}", "the new {t} felt {a}"]
closers = ["", " and i would say so again", " from start to finish", ", as my friends agreed",
           " for the price", " this time"]


def review(label):
    words = good if label == "positive" else bad
    text = rng.choice(openers).format(t=rng.choice(things), a=rng.choice(words))
    if rng.random() < 0.5:
        text += " and " + rng.choice(["really ", "truly ", "quite ", ""]) + rng.choice(words)
    return (text + rng.choice(closers) + ".").capitalize()


def write(path, n, labelled=True):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "label"] if labelled else ["sentence"])
        for i in range(n):
            label = "positive" if i % 2 == 0 else "negative"
            w.writerow([review(label), label] if labelled else [review(label)])


write("reviews_train.csv", 400)
write("reviews_dev.csv", 80)
write("reviews_new.csv", 6, labelled=False)

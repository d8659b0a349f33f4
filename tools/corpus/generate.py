"""Generate daisy/corpus/builtin.txt, the built-in training corpus.

Every sentence here was written for DaisyChain-Web. The generator composes many short documents
(explanations, stories, letters, recipes, questions and answers, dialogues, lists, poems,
weather reports, diary entries, notices, how-to guides, fables) from hand-written template banks.
A template is a string with {slot} markers; a slot is filled from the fixed values a document
chose (its cast, its dish, its town) or else from BANK, recursively.

Determinism: the only randomness is random.Random(SEED), so `python -m tools.corpus.generate`
rewrites builtin.txt byte for byte (tests/test_corpus.py checks this).

Diversity: Composer.say() retries a template until the sentence it makes has been used fewer
than MAX_USES times, so no sentence repeats often even though the banks are finite.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import Counter
from pathlib import Path

from tools.corpus.topics import TOPICS

SEED = 20250601
TARGET_BYTES = 262_000            # stop adding documents once the corpus reaches this size
MAX_USES = 3                      # a sentence may be emitted at most this many times (soft)
DOCUMENT_SEPARATOR = "\n\n\n"     # documents are separated by two blank lines
OUTPUT_PATH = Path(__file__).resolve().parents[2] / "daisy" / "corpus" / "builtin.txt"

SLOT = re.compile(r"\{(\w+)\}")


# ---------------------------------------------------------------------------------------------
# Shared word banks. Entries may themselves contain {slots}.
# ---------------------------------------------------------------------------------------------

WOMEN = ["Mara", "Ines", "Priya", "Hana", "Lucia", "Greta", "Nadia", "Olive", "Rosa", "Tamsin",
         "Yara", "Chloé", "Zoë", "Bea", "Ada", "Freya", "Leila", "Mei", "Sunniva", "Ruth",
         "Amara", "Celeste", "Dora", "Elif", "Ingrid", "Juno", "Kit", "Renée", "Sofia", "Wren"]
MEN = ["Tomas", "Arjun", "Felix", "Owen", "Kofi", "Henrik", "Jonah", "Mateo", "Samir", "Theo",
       "Ivo", "José", "Emil", "Bram", "Callum", "Dev", "Ezra", "Gus", "Hugo", "Idris",
       "Jasper", "Kenji", "Leon", "Milo", "Nico", "Oskar", "Rafael", "Silas", "Tobias", "André"]

TOWNS = ["Larkford", "Eastmere", "Pennywick", "Cobble Hill", "Ashby Cross", "Thornwick",
         "Saltmarsh", "Brindle", "Fernhollow", "Kestrel Point", "Oakhaven", "Wyndham Green",
         "Lower Dunmore", "Harrowgate Sands", "Millbeck", "Stonebridge", "Alder Vale", "Quayside"]

BANK: dict[str, list[str]] = {
    "town": TOWNS,
    "weekday": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "month": ["January", "February", "March", "April", "May", "June", "July", "August",
              "September", "October", "November", "December"],
    "season": ["spring", "summer", "autumn", "winter"],
    "time_of_day": ["early in the morning", "just after breakfast", "around midday",
                    "in the middle of the afternoon", "as the light was fading",
                    "late in the evening", "just before dawn", "after supper",
                    "while the kettle was still warm", "on a grey morning"],
    "sky": ["the sky was the colour of old pewter", "a thin rain was drifting in from the hills",
            "the sun sat low and orange over the rooftops", "a cold wind rattled the windows",
            "the air smelled of cut grass and woodsmoke", "fog had settled in the low fields",
            "the clouds were piled up like folded laundry", "the first frost had silvered the grass",
            "swallows were flying low over the water", "the streets were still wet from a storm"],
    "food": ["a bowl of lentil soup", "toast with honey", "a slice of apple cake",
             "cold noodles with sesame", "a pot of mint tea", "warm flatbread and yogurt",
             "scrambled eggs with chives", "a pear and a piece of cheese", "leftover risotto",
             "a jam sandwich", "roasted chestnuts", "a plate of dumplings", "porridge with plums",
             "a wedge of quiche", "spiced chickpeas with rice", "a kipper and brown bread", "a mug of cocoa",
             "barley broth", "a baked potato with cheese", "figs and walnuts", "a bowl of ramen"],
    "hobby": ["repairing old radios", "growing tomatoes on the balcony", "learning the fiddle",
              "drawing birds", "building a model railway", "knitting a very long scarf",
              "keeping bees", "pressing wild flowers", "restoring a rowing boat",
              "learning to bake sourdough", "collecting maps", "practising calligraphy",
              "bookbinding", "pottery on a borrowed wheel", "birdwatching on the estuary", "juggling",
              "carving spoons from green wood", "playing the accordion", "tracing the family tree"],
    "book": ["a book about lighthouses", "a thick novel about a family of clockmakers",
             "a guide to mushrooms", "a collection of sea stories", "an atlas of the night sky",
             "a history of bridges", "a cookbook from the mountains", "a book of riddles",
             "a memoir by a retired ship's cook", "a field guide to beetles",
             "a biography of a forgotten botanist", "a detective novel set on a canal boat",
             "an illustrated encyclopaedia of knots", "a volume of letters between two astronomers"],
    "adj_good": ["lovely", "wonderful", "peaceful", "cheerful", "splendid", "pleasant", "busy",
                 "surprising", "gentle"],
    "animal": ["a fox", "a heron", "two magpies", "a hedgehog", "a pair of ducks", "a hare",
               "a small brown dog", "a woodpecker", "a seal", "a tabby cat", "a family of geese"],
}


def pronouns(name: str) -> tuple[str, str, str]:
    """(subject, possessive, object) pronouns for a name from WOMEN or MEN."""
    return ("she", "her", "her") if name in WOMEN else ("he", "his", "him")


def the(noun_phrase: str) -> str:
    """'a brass key' -> 'the brass key'."""
    for article in ("a ", "an ", "some ", "two "):
        if noun_phrase.startswith(article):
            return "the " + noun_phrase[len(article):]
    return noun_phrase


def capitalize_first(text: str) -> str:
    """Upper-case the first letter, skipping opening quotes and the like."""
    for i, ch in enumerate(text):
        if ch.isalpha():
            return text[:i] + ch.upper() + text[i + 1:]
    return text


class Composer:
    """A seeded random source plus a record of how often each sentence has been used."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.uses: Counter[str] = Counter()

    def pick(self, options):
        return self.rng.choice(options)

    def chance(self, probability: float) -> bool:
        return self.rng.random() < probability

    def between(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def sample(self, options, count: int):
        return self.rng.sample(options, count)

    def fill(self, template: str, slots: dict[str, str]) -> str:
        def replace(match: re.Match) -> str:
            key = match.group(1)
            value = slots[key] if key in slots else self.pick(BANK[key])
            return self.fill(value, slots) if "{" in value else value
        return SLOT.sub(replace, template)

    def say(self, templates: list[str], slots: dict[str, str] | None = None) -> str:
        """One filled, capitalized template; retried until it is not over-used."""
        slots = slots or {}
        for _ in range(40):
            text = capitalize_first(self.fill(self.pick(templates), slots))
            if self.uses[text] < MAX_USES:
                break
        self.uses[text] += 1
        return text

    def fresh(self, items: list) -> list:
        """The items (fixed sentences, or tuples whose first element is one) not yet over-used."""
        return [item for item in items if self.uses[item if isinstance(item, str) else item[0]]
                < MAX_USES]

    def use(self, sentence: str) -> str:
        self.uses[sentence] += 1
        return sentence

    def two_people(self) -> tuple[str, str]:
        first, second = self.sample(WOMEN + MEN, 2)
        return first, second

    def person_slots(self, prefix: str, name: str) -> dict[str, str]:
        subject, possessive, obj = pronouns(name)
        return {prefix: name, prefix + "_he": subject, prefix + "_his": possessive,
                prefix + "_him": obj}


def paragraph(sentences: list[str]) -> str:
    return " ".join(sentences)


# ---------------------------------------------------------------------------------------------
# Explanations and questions-and-answers: hand-written facts per topic (topics.py).
# ---------------------------------------------------------------------------------------------


EXPLAIN_OPENERS = [
    "Most of us take {subject} for granted, but the explanation is worth a few minutes.",
    "Here is a short explanation of {subject}, written for curious readers of any age.",
    "If you have ever wondered about {subject}, you are in good company.",
    "People have puzzled over {subject} for a very long time.",
    "The science behind {subject} is simpler than it first appears.",
    "A child once asked me about {subject}, and I realised I could not explain the matter properly.",
    "This note on {subject} comes from a talk given at the {town} library.",
    "There is a neat story behind {subject}, and it starts with something small.",
    "You can understand {subject} with nothing more than a little patience.",
    "Let us take a closer look at {subject}.",
]
EXPLAIN_LINKS = [
    "That is only half the picture.", "Now for the interesting part.", "Here is where it gets clever.",
    "It helps to think about what happens next.", "The details matter here.",
    "There is one more piece to the puzzle.", "To see why, follow the process step by step.",
    "A simple example makes this clearer.", "Something similar happens in many other places.",
    "This is easy to check for yourself.", "The next step is the one most people never hear about.",
    "Teachers in {town} like to explain the next part with a kitchen demonstration.",
    "Here the story of {subject} takes a turn.", "What happens next is the heart of {subject}.",
    "It is worth slowing down at this point.", "Consider what this means in practice.",
    "The second half of the story is just as interesting.", "Look a little closer and more appears.",
    "Picture it happening on a {adj_good} {season} day.", "There is a further twist.",
    "Try to imagine the scene at a much smaller scale.", "The rest follows naturally from this.",
    "Here, too, small causes have large effects.", "The same idea turns up again and again.",
]
EXPLAIN_CLOSERS = [
    "Next time you notice {subject}, you will know a little of what lies behind it.",
    "So the story of {subject} is one of small things adding up to something large.",
    "None of this makes {subject} less wonderful; if anything, it makes it more so.",
    "There is much more to learn about {subject}, but this is a good place to start.",
    "Understanding {subject} also helps explain many things that seem unrelated at first.",
    "If you want to explore {subject} further, try watching closely and asking why at each step.",
    "Scientists are still refining our picture of {subject}, and new details keep turning up.",
    "It is a good example of how careful observation can untangle an everyday mystery like {subject}.",
]


def explainer(c: Composer) -> str | None:
    topic = c.pick(TOPICS)
    facts = topic["facts"]
    count = c.between(4, 6)
    # A contiguous run keeps the argument coherent; half the time it starts at the beginning.
    start = 0 if c.chance(0.5) else c.between(1, len(facts) - count)
    chosen = facts[start:start + count]
    if len(c.fresh(chosen)) < count:
        return None
    for fact in chosen:
        c.use(fact)
    slots = {"subject": topic["subject"], "town": c.pick(TOWNS)}
    split = c.between(2, len(chosen) - 1)
    first = [c.say(EXPLAIN_OPENERS, slots)] + chosen[:split]
    second = [c.say(EXPLAIN_LINKS, slots)] + chosen[split:]
    parts = [topic["title"], paragraph(first), paragraph(second)]
    if c.chance(0.7):
        parts.append(c.say(EXPLAIN_CLOSERS, slots))
    return "\n\n".join(parts)


QA_TITLES = [
    "Questions and Answers", "Readers Ask", "Ask the Librarian", "Curious Questions",
    "Questions from the {town} Science Club", "Your Questions Answered", "Small Questions, Short Answers",
    "Overheard at the Museum Help Desk", "The Question Box",
]


def questions_and_answers(c: Composer) -> str | None:
    pairs = c.fresh([pair for topic in TOPICS for pair in topic["qa"]])
    if len(pairs) < 3:
        return None
    chosen = c.sample(pairs, c.between(3, min(5, len(pairs))))
    style = c.pick(["Q/A", "names", "bare"])
    lines = [c.say(QA_TITLES)]
    asker, answerer = c.two_people()
    for question, answer in chosen:
        c.use(question)
        if style == "Q/A":
            lines.append(f"Q: {question}\nA: {answer}")
        elif style == "names":
            lines.append(f"{asker} asks: {question}\n{answer}")
            asker = c.pick(WOMEN + MEN)
        else:
            lines.append(f"{question}\n{answer}")
    if style != "bare" and c.chance(0.5):
        lines.append(f"Answers by {answerer}. Send your own questions to the {c.pick(TOWNS)} library.")
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Stories.
# ---------------------------------------------------------------------------------------------

STORY_BANK = {
    "place": ["the old lighthouse", "the covered market", "the orchard behind the school",
              "the boathouse by the river", "the attic of the village hall", "the disused railway station",
              "the walled garden", "the bakery on Mill Lane", "the harbour wall", "the greenhouse at the allotments",
              "the museum's storeroom", "the ferry landing", "the bell tower", "the bookshop on the corner",
              "the clock repair shop", "the hill above the quarry", "the reed beds by the estuary", "the abandoned observatory",
              "the tannery yard", "the chapel ruins", "the signal box", "the cider press barn"],
    "object": ["a brass key", "an old compass", "a tin box of letters", "a silver spoon", "a wooden flute",
               "a torn map", "a blue notebook", "a pocket watch", "a jar of buttons", "a red kite",
               "a small brass bell", "an envelope with no stamp", "a carved chess piece", "a lantern",
               "a photograph of a ship", "a pair of reading glasses", "a spool of green thread",
               "a cracked porcelain doll", "a velvet purse of foreign coins", "an engraved thimble",
               "a telescope missing its lens cap", "a recipe book with a wax seal"],
}

STORY_OPENINGS = [
    "{hero} had lived in {town} for years, but {hero_he} had never once been inside {place}.",
    "On the first cold morning of {season}, {hero} found {object} on the doorstep.",
    "Nobody in {town} could remember when {place} had last been opened, until {hero} tried the door.",
    "It began, as many things do, with {object} that nobody wanted to claim.",
    "{hero} was the sort of person who noticed small things, and that {weekday} {hero_he} noticed {object}.",
    "The summer {hero} turned twelve, {hero_he} spent nearly every afternoon at {place}.",
    "{hero} and {friend} had been friends since the winter the river froze.",
    "Every town has a story it tells about {place}, and {town} was no different.",
    "{hero} ran the little repair stall in {town}, and people brought {hero_him} all sorts of broken things.",
    "When {hero} moved to {town}, the first person {hero_he} met was {friend}.",
    "The letter that arrived for {hero} on {weekday} contained nothing but a drawing of {place}.",
    "{hero} was supposed to be tidying {hero_his} room, but {hero_he} was thinking about {place}.",
]
STORY_SETTINGS = [
    "Outside, {sky}.", "That day {sky}, and the streets of {town} were almost empty.",
    "By the time {hero_he} set off, {sky}.", "{time_of_day}, {sky}, and {hero} pulled on a coat.",
    "The town was quiet; somewhere a dog barked and a door banged shut.",
    "The path was muddy, and {hero_his} boots were soon heavy with it.",
    "Inside, it smelled of dust, candle wax and something faintly sweet.",
    "A gull watched {hero_him} from the railing with an unfriendly yellow eye.",
    "{animal} crossed the lane in front of {hero_him} and vanished into the hedge.",
    "The sound of the church clock drifted over the roofs as {hero_he} walked.",
    "The shutters of the ironmonger's shop were still down, and a bicycle leaned against the lamp post.",
    "Somebody was frying onions nearby, and the smell followed {hero_him} all the way down the hill.",
    "Puddles shone in the cobbles like pieces of a broken mirror.",
    "A tractor grumbled along the lane, trailing wisps of hay from its trailer.",
    "The wind carried the clang of halyards against the masts in the marina.",
    "Chimney smoke leaned sideways over the slate roofs of {town}.",
]
STORY_PROBLEMS = [
    "But when {hero_he} looked again, {the_object} had gone.",
    "Scratched on the back of {the_object} were three words: look under the stairs.",
    "The trouble was that {the_object} belonged to someone, and {hero} had no idea who.",
    "{friend} said {fhe} had seen {the_object} before, a long time ago, in {place}.",
    "There was a note tucked inside, written in faded pencil, asking whoever found it to return it to {place}.",
    "By evening, half the town had heard about {the_object}, and everyone had a different theory.",
    "The door to {place} was locked, and the only window was far too high to reach.",
    "{hero} realised, with a sinking feeling, that {hero_he} had promised to be home an hour ago.",
    "Then the lights went out all along the street.",
    "A storm was coming, and {place} was on the far side of the marshes.",
    "The caretaker insisted that nobody had been up there for forty years, yet the dust on the stairs was disturbed.",
    "Worse still, the handwriting on the label looked exactly like {hero}'s own.",
    "When {hero} held {the_object} up to the window, faint numbers appeared, scratched into the surface.",
    "A stranger in a mustard-coloured raincoat had been asking about {the_object} at every shop in {town}.",
]
SAID_LINES = [
    "I think we should start at {place}", "It has to be here somewhere", "We can't just leave it",
    "My grandmother used to tell a story about this", "Let's ask at the bakery, they know everybody",
    "I'm not scared, I'm just cold", "Look, there are footprints in the dust",
    "Someone has been here recently", "We should have brought a torch",
    "If we hurry, we can be back before dark", "I've got a better idea",
    "That's the strangest thing I've ever seen", "Keep your voice down",
    "It's probably nothing, but I want to be sure", "You always say that",
    "I told you {the_object} was important", "Wait, I hear something",
    "This reminds me of the summer we got lost on the hill", "Give me a moment to think",
    "We'll need a ladder, or a very tall friend",
]
ASKED_LINES = [
    "Do you think anyone will believe us", "What if it isn't there", "Have you ever been inside {place}",
    "Why would anyone hide {the_object}", "Who do you suppose it belonged to", "Can you see anything",
    "Are you sure this is the right way", "What time is it", "Did you hear that",
    "Shall we go back", "What would your mother say", "Is that a door or just a shadow",
    "How long has {the_object} been lying here", "Should we tell the caretaker", "Whose footprints are those",
    "Do you remember the way back", "Is anybody there", "Could the map be upside down",
    "Why is the clock in {place} always ten minutes slow", "Did you bring anything to eat",
]
SPEECH_TAGS = ["said {speaker}", "{speaker} said", "{speaker} whispered", "{speaker} replied",
               "said {speaker} quietly", "{speaker} said with a grin", "{speaker} muttered",
               "{speaker} called over {speaker_his} shoulder", "said {speaker}, frowning"]
ASK_TAGS = ["asked {speaker}", "{speaker} asked", "{speaker} wondered aloud",
            "{speaker} asked softly", "asked {speaker}, peering into the gloom"]
STORY_ATTEMPTS = [
    "They searched the shelves, the drawers and even the old coal scuttle.",
    "{hero} knocked on doors up and down the street, but nobody knew anything.",
    "{friend} fetched a ladder from the shed, and they climbed up one at a time.",
    "They followed the lane past the chapel, counting the gateposts as they went.",
    "{hero} unfolded {hero_his} map on a bench and traced the old paths with a finger.",
    "For an hour they found nothing but cobwebs, a broken umbrella and a mouse's nest.",
    "{friend} remembered a rhyme {fhe} had learned as a child, and they tried to work out what it meant.",
    "They asked the woman at the post office, who sent them to the man at the boatyard.",
    "They waited until the tide was out and walked across the wet sand to the rocks.",
    "{hero} lit the lantern, and the shadows drew back into the corners.",
    "They borrowed a magnifying glass from the pharmacist and studied every scratch and smudge.",
    "{hero} telephoned {hero_his} uncle, who had once been the harbourmaster, and scribbled notes while he talked.",
    "They pored over old newspapers in the reading room until the librarian began switching off the lamps.",
    "{friend} sketched a plan of the building on the back of a bus ticket.",
    "They tried every key on the caretaker's enormous ring, one after another.",
]
STORY_DISCOVERIES = [
    "Behind a loose board was a small cupboard, and inside it was a bundle tied with string.",
    "At last {friend} gave a shout, and {hero} ran over to see what {fhe} had found.",
    "Pressed into the mud was a trail of small, neat footprints leading towards {place}.",
    "The answer, when it came, was so simple that they both laughed out loud.",
    "There, written in chalk on the wall, was the name of {hero}'s own grandfather.",
    "The bell rang once, though nobody had touched it.",
    "Under the floorboards they found a tin, rusted shut, that rattled when they shook it.",
    "{hero} noticed that one of the paving stones was a slightly different colour from the rest.",
    "Wedged behind the chimney breast was a leather satchel, stiff with age, containing a bundle of ledgers.",
    "The numbers turned out to be a date, the very day the old ferry had made its final crossing.",
    "A faded photograph slid out from between the pages and fluttered to the floor.",
    "The last key turned with a groan, and the door swung inward onto a room full of clocks.",
]
STORY_ENDINGS = [
    "They walked home slowly, talking over every detail, and {sky}.",
    "Years later, {hero} still kept {the_object} on the shelf above {hero_his} desk.",
    "That night {hero} slept better than {hero_he} had in weeks.",
    "{friend} never told anyone the whole story, and neither did {hero}.",
    "From then on, whenever {hero} passed {place}, {hero_he} smiled to {hero_him}self.",
    "The next morning, {the_object} was back where it had always been, as if nothing had happened.",
    "They agreed to meet again on {weekday}, because there was still the question of the second key.",
    "And if you visit {town} today, someone will be glad to tell you the story, though they will get it slightly wrong.",
    "{hero} wrote it all down in {hero_his} notebook, so that {hero_he} would never forget.",
    "In the end, it was the best {season} either of them could remember.",
    "The museum in {town} put {the_object} in a glass case, with a small card naming {hero} and {friend}.",
    "Afterwards they sat on the harbour wall eating chips, too tired and too happy to say much.",
    "Nobody ever did explain the footprints, and {hero} decided {hero_he} rather liked it that way.",
]
STORY_TITLES = ["The Mystery of {the_object_title}", "{hero} and {the_object_title}", "A {season_title} Story",
                "What {hero} Found", "The Secret of {place_title}", "{hero} and {friend}", "An Evening in {town}",
                "The Door at {place_title}", "Lost and Found", "A Story from {town}"]


def title_case(text: str) -> str:
    small = {"a", "an", "the", "of", "and", "in", "on", "at", "by", "to", "for", "with", "no"}
    words = text.split()
    return " ".join(w if (w in small and i) else w[:1].upper() + w[1:] for i, w in enumerate(words))


def speech(c: Composer, speaker: str, slots: dict[str, str], said: list[str], asked: list[str]) -> str:
    """One line of dialogue; said/asked are this story's unused lines (popped, so none repeats)."""
    slots = dict(slots, speaker=speaker, speaker_his=pronouns(speaker)[1])
    if c.chance(0.35):
        line, tag, mark = asked.pop(), c.pick(ASK_TAGS), "?"
    else:
        line, tag, mark = said.pop(), c.pick(SPEECH_TAGS), c.pick([",", ",", "!"])
    c.uses[line] += 1   # the unfilled line, so c.fresh() can steer later stories away from it
    line = c.fill(line, slots)
    tag = c.fill(tag, slots)
    if tag.startswith(speaker):   # '"..." Mara said.' reads better inverted only sometimes
        text = f'{tag}, "{capitalize_first(line)}{"?" if mark == "?" else "."}"'
        text = capitalize_first(text)
    else:
        text = f'"{capitalize_first(line)}{mark}" {tag}.'
    c.uses[text] += 1
    return text


def story(c: Composer) -> str:
    hero, friend = c.two_people()
    obj, place = c.pick(STORY_BANK["object"]), c.pick(STORY_BANK["place"])
    slots = {**c.person_slots("hero", hero), "friend": friend, "fhe": pronouns(friend)[0],
             "object": obj, "the_object": the(obj), "place": place, "town": c.pick(TOWNS)}
    slots["the_object_title"] = "the " + title_case(the(obj)[len("the "):])
    slots["place_title"] = "the " + title_case(place[len("the "):])
    slots["season_title"] = c.pick(BANK["season"]).capitalize()
    opening = [c.say(STORY_OPENINGS, slots), c.say(STORY_SETTINGS, slots)]
    if c.chance(0.5):
        opening.append(c.say(STORY_SETTINGS, slots))
    middle = [c.say(STORY_PROBLEMS, slots)]
    said = c.sample(c.fresh(SAID_LINES) if len(c.fresh(SAID_LINES)) >= 4 else SAID_LINES, 4)
    asked = c.sample(c.fresh(ASKED_LINES) if len(c.fresh(ASKED_LINES)) >= 4 else ASKED_LINES, 4)
    talk = [speech(c, speaker, slots, said, asked) for speaker in [friend, hero, friend, hero][:c.between(2, 4)]]
    search = [c.say(STORY_ATTEMPTS, slots), c.say(STORY_ATTEMPTS, slots), c.say(STORY_DISCOVERIES, slots)]
    end = [c.say(STORY_ENDINGS, slots)]
    parts = [c.fill(c.pick(STORY_TITLES), slots), paragraph(opening), paragraph(middle)]
    parts += talk if c.chance(0.6) else [paragraph(talk)]
    parts += [paragraph(search), paragraph(end)]
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Fables.
# ---------------------------------------------------------------------------------------------

FABLE_ANIMALS = [("Fox", "clever"), ("Tortoise", "patient"), ("Crow", "proud"), ("Mouse", "small but brave"),
                 ("Bear", "sleepy"), ("Heron", "vain"), ("Ant", "hard-working"), ("Goat", "stubborn"),
                 ("Owl", "wise"), ("Hare", "boastful"), ("Otter", "playful"), ("Badger", "grumpy"),
                 ("Sparrow", "chatty"), ("Wolf", "greedy"), ("Frog", "impatient"), ("Squirrel", "anxious")]
FABLE_PLACES = ["at the edge of a great forest", "beside a slow brown river", "in a meadow full of clover",
                "on a rocky hillside", "near a farm with a leaking barn", "by a pond covered in lilies",
                "among the roots of an ancient oak"]
FABLE_EVENTS = [
    "One dry summer, the stream shrank to a trickle, and every creature grew thirsty.",
    "One autumn, the {b} announced that it would hold a race to the top of the hill.",
    "One day the {a} found a heap of ripe berries and decided to keep them all.",
    "When the first snow came, the {a} had stored nothing at all for the winter.",
    "One evening the {b} boasted that nobody in the whole valley could fool it.",
    "A hunter's net fell across the path one morning, and the {b} was caught fast.",
    "A great storm knocked down the bridge of fallen branches that everyone used to cross the river.",
]
FABLE_TURNS = [
    "The {a} laughed and said it had more important things to do.",
    "The {a} thought for a long while and then made a quiet plan.",
    "The {a} offered to help, though it asked for nothing in return.",
    "The {a} pretended not to care, but it watched the {b} closely.",
    "At first the {a} refused, but then it remembered an old kindness.",
    "The {a} tried to trick the {b} with flattery and a sweet voice.",
]
FABLE_OUTCOMES = [
    "In the end the {b} had to admit that the {a} had been right all along.",
    "By spring the {a} was thinner and wiser, and the {b} shared what it had.",
    "The trick failed, and the {a} went home with nothing but a sore nose.",
    "Working together, they managed what neither could have done alone.",
    "The {b} never boasted again, at least not where the {a} could hear.",
    "Later, when the {a} was in trouble, the {b} remembered and came to help.",
]
MORALS = [
    "Slow and steady work outlasts a quick boast.", "A kindness given is seldom wasted.",
    "Flattery is sweet, but it is a poor meal.", "Those who share in plenty are helped in need.",
    "Pride goes before a tumble.", "Prepare for winter while the sun still shines.",
    "Many small hands make a heavy load light.", "Do not mistake a loud voice for a wise one.",
    "A friend in trouble is a friend to keep.", "Greed loses what patience would have gained.",
    "Listen first, and you will rarely need to apologise.", "Even the smallest creature can repay a favour.",
    "What you laugh at today may feed you tomorrow.", "A plan shared is a plan half done.",
    "The one who boasts of never being fooled is the easiest to fool.", "Hurry, and you may pass what you seek.",
    "A full store is better than a clever excuse.", "Trust is slow to grow and quick to fall.",
    "Strength is nothing without sense.", "Mind your own nest before you mock another's.",
]


def fable(c: Composer) -> str:
    (a, trait_a), (b, trait_b) = c.sample(FABLE_ANIMALS, 2)
    slots = {"a": a, "b": b}
    body = [f"Once, {c.pick(FABLE_PLACES)}, there lived a {trait_a} {a} and a {trait_b} {b}.",
            c.say(FABLE_EVENTS, slots), c.say(FABLE_TURNS, slots), c.say(FABLE_OUTCOMES, slots)]
    body[0] = c.use(body[0])
    return f"The {a} and the {b}\n\n{paragraph(body)}\n\nMoral: {c.say(MORALS)}"


# ---------------------------------------------------------------------------------------------
# Letters and diary entries.
# ---------------------------------------------------------------------------------------------

LETTER_OPENERS = [
    "Thank you for your letter, which arrived on {weekday} and made me smile all morning.",
    "I am sorry it has taken me so long to write back; the weeks have simply run away with me.",
    "I hope this finds you well, and that the {season} is treating you kindly.",
    "It was lovely to see you last month, and the house has felt very quiet since you left.",
    "Your parcel arrived safely, and I have already eaten far too much of the shortbread.",
    "I have been meaning to write ever since you told me your news.",
    "Greetings from {town}, where {sky}.",
    "I am writing this at the kitchen table while {food} goes cold beside me.",
]
LETTER_NEWS = [
    "The garden has gone a little wild, but the beans are climbing and the roses have come back.",
    "I have taken up {hobby}, which is harder than it looks but very satisfying.",
    "{name} came to stay for a few days, and we walked all the way to the lighthouse and back.",
    "The bakery on the corner has closed, which everyone is sad about, though a café may open in its place.",
    "We had a storm last week that brought down the old pear tree, so there will be no pears this year.",
    "I am reading {book}, and I keep wanting to read bits of it aloud to anyone nearby.",
    "The town has finally mended the bridge, so the bus no longer has to go the long way round.",
    "Work has been busy, but in a good way, and I have been asked to help train the new apprentices.",
    "The cat has decided that the laundry basket is her new home and glares at anyone who needs a towel.",
    "There was a concert in the square on {weekday}, and half of {town} turned out to listen.",
    "I finally painted the front door, a deep green, and I am ridiculously pleased with it.",
    "My neighbour {name} has been teaching me the names of the stars from the back step.",
    "We have had {animal} visiting the garden every evening, which the children think is marvellous.",
    "The allotment is producing more courgettes than anyone could possibly eat.",
    "I went to the market in {town} and came home with a basket of plums and a chipped blue jug.",
    "The river burst its banks in {month}, and we spent a soggy weekend carrying sandbags and drinking strong tea.",
    "I have joined a choir, and we are rehearsing an enormous piece with a very tricky fugue in the middle.",
    "The old cinema has reopened, with velvet seats, an organ and an usher who remembers everybody's name.",
    "I have been volunteering at the animal sanctuary, mostly mucking out, but also bottle-feeding two orphaned lambs.",
    "The orchard gave us so many damsons that I have made jam, chutney, gin and a rather odd cordial.",
    "My bicycle was stolen from outside the station, then returned two days later with new brakes, which is a mystery.",
    "I have started learning Portuguese from a cheerful woman at the market who refuses to speak anything else to me.",
    "The roof leaked during the storm, so there is now a bucket in the hallway that everyone steps around.",
]
LETTER_QUESTIONS = [
    "How is the new job going, and are the people there kind to you?",
    "Did you ever finish building the {furniture}?", "Is {name} still thinking of moving to {town}?",
    "Have you had much {weather_word} where you are?", "Are you still {routine}?", "How are the {pets}?",
    "Did the move to {town} go smoothly in the end?", "Have you found a good {shop} near the new flat?",
    "Are the children enjoying their new school in {town}?", "What are you reading at the moment?",
    "Is your {body_part} any better?", "Did {name} ever send you the photographs from the wedding?",
    "Have you kept up with {hobby}?", "Did the {garden_thing} survive the winter?",
    "When do you think you might be in {town} again?", "Is the {shop} on your street still open?",
    "Have you heard anything from {name} lately?", "What did you decide about the {furniture}?",
]
LETTER_BANK = {
    "furniture": ["bookshelf", "garden bench", "kitchen table", "bird table", "wardrobe", "rocking chair"],
    "weather_word": ["snow", "rain", "wind", "sunshine", "fog"],
    "routine": ["swimming every morning", "walking to work", "singing with the choir", "cycling at weekends",
                "going to the Tuesday market", "playing chess in the park"],
    "pets": ["hens", "goats", "cats", "bees", "goldfish", "rabbits"],
    "shop": ["bakery", "bookshop", "greengrocer", "hardware shop", "café", "fishmonger"],
    "body_part": ["knee", "back", "wrist", "shoulder", "ankle"],
    "garden_thing": ["fig tree", "lemon tree", "rosemary", "vine", "old apple tree", "geraniums"],
}
LETTER_PLANS = [
    "I am hoping to visit in {month}, if that would suit you.",
    "Do come and stay whenever you like; the spare room is always ready.",
    "Perhaps we could meet halfway, in {town}, and have lunch by the harbour.",
    "I will send the recipe you asked for in my next letter.",
    "Let me know when you are free, and I will come on the early train.",
    "We are planning a small party in {month}, and it would not be the same without you.",
]
LETTER_SIGNOFFS = ["With love,", "Warm wishes,", "Yours as ever,", "All my best,", "Fondly,",
                   "Take care of yourself,", "Until next time,", "With much affection,"]


def letter(c: Composer) -> str:
    writer, reader = c.two_people()
    slots = {**{key: c.pick(values) for key, values in LETTER_BANK.items()}, "name": c.pick([n for n in WOMEN + MEN if n not in (writer, reader)])}
    day = f"{c.pick(BANK['weekday'])} {c.between(1, 28)} {c.pick(BANK['month'])}"
    header = f"{c.pick(TOWNS)}, {day}" if c.chance(0.5) else day
    body = [paragraph([c.say(LETTER_OPENERS, slots), c.say(LETTER_NEWS, slots)]),
            paragraph([c.say(LETTER_NEWS, slots), c.say(LETTER_NEWS, slots)]),
            paragraph([c.say(LETTER_QUESTIONS, slots), c.say(LETTER_QUESTIONS, slots), c.say(LETTER_PLANS, slots)])]
    ending = f"{c.pick(LETTER_SIGNOFFS)}\n{writer}"
    if c.chance(0.3):
        ending += f"\n\nP.S. {c.say(LETTER_NEWS, slots)}"
    return "\n\n".join([header, f"Dear {reader},"] + body + [ending])


DIARY_MORNING = [
    "Woke before the alarm and lay listening to the rain on the skylight.",
    "Up early; the house was cold, so I lit the stove and made {food}.",
    "Overslept again and had to run for the bus with my shoelaces undone.",
    "Walked to {town} along the canal path; {animal} was waiting by the lock.",
    "Spent the first hour of the morning on {hobby}, and lost track of time completely.",
    "Breakfast was {food}, eaten standing up by the window.",
    "Frost on the inside of the windows; scraped a peephole and watched the postman slither past.",
    "Woke to the sound of the neighbours' cockerel, who has no sense of time whatsoever.",
    "Swam in the lido before work; the water was freezing and wonderful.",
]
DIARY_DAY = [
    "Work was slow until lunchtime and then everything happened at once.",
    "{name} rang to say the repairs are finished, which is a relief.",
    "Spent the afternoon sorting the shed and found a box of letters I had forgotten about.",
    "Tried a new route home and ended up in a street I have never seen before.",
    "Met {name} at the café and we talked for two hours about nothing in particular.",
    "The library had {book} waiting for me at last.",
    "Helped {name} carry a wardrobe up three flights of stairs; my arms are still complaining.",
    "It rained so hard at midday that the gutters overflowed and the road became a stream.",
    "Finally mended the bicycle puncture, on the third attempt.",
    "Planted a row of onions and two rows of carrots before the light went.",
    "The plumber came at last, tutted at the pipes for an hour, and promised to return with a special spanner.",
    "Walked the coast path to the next cove; the cliffs were yellow with gorse and noisy with kittiwakes.",
    "Spent the afternoon varnishing the boat, and now everything I own smells of turpentine.",
    "Queued at the post office behind a man posting what looked like a violin.",
    "Cleared the gutters and found a tennis ball, a nest and a surprising quantity of moss.",
    "Rearranged the bookshelves by colour, then changed my mind and put them back by author.",
]
DIARY_EVENING = [
    "Supper was {food}, and an early night.", "Read {book} until my eyes closed.",
    "In the evening {sky}, and I sat outside with a blanket until it got too dark to read.",
    "Wrote three letters and actually posted them, which must be a record.",
    "Listened to the radio while washing up; a programme about deep-sea fish.",
    "{name} came round with a cake, and we ate most of it.",
    "Played cards with {name} by candlelight because of the power cut, and lost every hand.",
    "Baked bread in the evening; the crust crackled as it cooled on the windowsill.",
    "Watched the bats come out over the pond until the midges drove me indoors.",
]
DIARY_THOUGHTS = [
    "I keep thinking I should write more of these down.", "Tomorrow I must remember to buy stamps.",
    "It has been a {adj_good} day, on the whole.", "Not a remarkable day, but a good one.",
    "I would like to learn the names of more birds.", "Note to self: the blue jacket needs a button.",
    "I am slowly getting used to the quiet.", "Must ring {name} on {weekday}.",
]


def diary(c: Composer) -> str:
    slots = {"name": c.pick(WOMEN + MEN)}
    date = f"{c.pick(BANK['weekday'])}, {c.between(1, 28)} {c.pick(BANK['month'])}"
    lines = [c.say(DIARY_MORNING, slots), c.say(DIARY_DAY, slots), c.say(DIARY_DAY, slots),
             c.say(DIARY_EVENING, slots)]
    if c.chance(0.6):
        lines.append(c.say(DIARY_THOUGHTS, slots))
    return f"{date}\n\n{paragraph(lines)}"


# ---------------------------------------------------------------------------------------------
# Recipes.
# ---------------------------------------------------------------------------------------------

RECIPES = {
    "soup": {
        "names": ["{main} and {extra} Soup", "Creamy {main} Soup", "Winter {main} Soup with {herb}",
                  "Simple {main} Soup"],
        "main": ["carrot", "leek", "pumpkin", "tomato", "lentil", "sweet potato", "mushroom", "pea"],
        "extra": ["ginger", "potato", "red pepper", "white bean", "celery", "fennel", "apple"],
        "amounts": ["{n} large {main}s or about 500 g of {main}", "1 onion", "{garlic} cloves of garlic",
                    "1 {extra}", "1 litre of vegetable stock", "{oil} tablespoons of olive oil",
                    "a handful of fresh {herb}", "salt and black pepper"],
        "steps": [
            ["Peel and roughly chop the onion and {garlic} cloves of garlic.", "Chop the onion finely and crush the garlic with a little salt, keeping a few {herb} stalks aside."],
            ["Warm the oil in a large pan over a medium heat and cook the onion for {t1} minutes, until soft.",
             "Melt a knob of butter with the oil in a heavy pan and soften the onion gently for {t1} minutes."],
            ["Add the {main} and the {extra}, stir well, and cook for another {t2} minutes.",
             "Stir in the {main}, the {extra} and the garlic, and let them sweat with the lid on for {t2} minutes."],
            ["Pour in the stock, bring it to the boil, then turn it down and simmer for {t3} minutes.",
             "Add the stock and a pinch of salt, and simmer gently for about {t3} minutes, until everything is tender."],
            ["Blend the {main} soup until smooth, adding a splash of water if it seems too thick.",
             "Mash the {main} roughly if you like a chunky soup, or blend it if you prefer it smooth."],
            ["Taste, season with salt and pepper, and scatter the {herb} over the top before serving.",
             "Serve hot with a swirl of yogurt, a little chopped {herb} and plenty of bread."],
        ],
    },
    "salad": {
        "names": ["{main} Salad with {extra}", "Summer Salad of {main} and {herb}", "Crunchy {main} Salad"],
        "main": ["cucumber", "tomato", "chickpea", "beetroot", "new potato", "cabbage", "grain"],
        "extra": ["feta", "toasted walnuts", "orange", "radish", "roasted seeds", "apple", "olives"],
        "amounts": ["300 g of {main}", "{n} spring onions", "100 g of {extra}", "a bunch of {herb}",
                    "{oil} tablespoons of olive oil", "1 tablespoon of lemon juice", "1 teaspoon of honey",
                    "a pinch of salt"],
        "steps": [
            ["Wash the {main} and cut it into bite-sized pieces.", "Prepare the {main}, slicing it thinly so it soaks up the dressing."],
            ["Slice {n} spring onions and pick the leaves from the {herb}.", "Chop the {herb} and the spring onions together."],
            ["Whisk the oil, lemon juice, honey and salt in a small bowl for {t1} seconds, until thick.",
             "Shake the oil, lemon juice, honey and salt together in a clean jar with a pinch of {herb}."],
            ["Toss the {main} with the dressing and leave it for {t1} minutes so the flavours mingle.",
             "Pour the dressing over the {main} and turn everything gently with your hands."],
            ["Scatter the {extra} and the herbs over the top just before serving.",
             "Add the {extra} at the last moment, so it stays fresh and crisp."],
        ],
    },
    "bake": {
        "names": ["{main} Cake", "{extra} and {main} Loaf", "Grandmother's {main} Cake", "Sticky {main} Bars"],
        "main": ["apple", "banana", "carrot", "lemon", "plum", "ginger", "honey", "pear"],
        "extra": ["walnut", "cinnamon", "almond", "oat", "raisin", "vanilla", "hazelnut"],
        "amounts": ["{flour} g of flour", "2 teaspoons of baking powder", "{butter} g of soft butter",
                    "{sugar} g of sugar", "{n} eggs", "2 ripe {main}s, or the zest of 2 if using lemon",
                    "50 g of {extra}", "a pinch of salt", "{n} tablespoons of milk"],
        "steps": [
            ["Heat the oven to {temp} degrees and line a tin with baking paper.",
             "Turn the oven on to {temp} degrees and grease a loaf tin with a little butter."],
            ["Beat the butter and sugar together for {t1} minutes, until pale and fluffy.",
             "Cream the butter with the sugar and a pinch of {extra}, until light."],
            ["Add the {n} eggs one at a time, beating well after each.",
             "Beat in the {n} eggs, one by one, adding a spoonful of flour if the mixture starts to curdle."],
            ["Fold in the flour, baking powder and salt, then the {main} and the {extra}.",
             "Gently stir in the dry ingredients, followed by the {main}, the {extra} and the milk."],
            ["Spoon the mixture into the tin and bake for {t3} minutes, until a skewer comes out clean.",
             "Smooth the top and bake for about {t3} minutes, until golden and springy to the touch."],
            ["Let it cool in the tin for {t1} minutes before turning it out onto a rack.",
             "Leave it to cool for at least {t1} minutes; it slices much more neatly when cold."],
        ],
    },
    "pasta": {
        "names": ["Pasta with {main} and {extra}", "Quick {main} Pasta", "Baked Pasta with {main}"],
        "main": ["mushroom", "courgette", "spinach", "tomato", "broccoli", "roasted pepper"],
        "extra": ["lemon", "chilli", "pine nuts", "cream", "capers", "parmesan", "ricotta"],
        "amounts": ["{pasta} g of dried pasta", "300 g of {main}", "{garlic} cloves of garlic", "some {extra}",
                    "{oil} tablespoons of olive oil", "a handful of {herb}", "salt and pepper"],
        "steps": [
            ["Bring a large pan of well-salted water to the boil for the {main} pasta.", "Put about {n} litres of water on to boil and salt it generously."],
            ["Meanwhile, slice the garlic and cut the {main} into small pieces.",
             "While the water heats, prepare the {main} and slice the garlic thinly."],
            ["Cook the pasta for {t2} minutes, or a minute less than the packet says.",
             "Drop the pasta into the boiling water and cook it for about {t2} minutes, stirring once or twice."],
            ["Fry the garlic in the oil for a minute, then add the {main} and cook for {t1} minutes.",
             "In a wide pan, cook the {main} with the garlic and oil for {t1} minutes, until it softens."],
            ["Save a cup of the cooking water, then drain the pasta and tip it into the pan with the {main}.",
             "Scoop the pasta straight into the pan, bringing a little of its water with it."],
            ["Add the {extra} and toss everything together, loosening it with the cooking water.",
             "Stir in the {extra}, season well, and finish with the {herb}."],
        ],
    },
    "pancakes": {
        "names": ["{main} Pancakes", "Weekend Pancakes with {extra}", "Fluffy {main} Pancakes"],
        "main": ["buttermilk", "oat", "blueberry", "banana", "buckwheat", "apple"],
        "extra": ["maple syrup", "stewed plums", "lemon and sugar", "yogurt and honey", "berries"],
        "amounts": ["150 g of flour", "1 teaspoon of baking powder", "1 egg", "200 ml of milk",
                    "1 tablespoon of melted butter", "a little {main}", "{extra}, to serve"],
        "steps": [
            ["Mix the flour and baking powder for the {main} pancakes in a large bowl.", "Sift the flour and baking powder into a bowl big enough for {n} people's pancakes."],
            ["Whisk the egg with the milk and melted butter for about {t1} seconds.", "Beat the egg, milk and butter together in a jug until no streaks of {main} remain."],
            ["Pour the wet mixture into the dry and stir just until combined; a few lumps in the {main} batter are fine.",
             "Make a well in the flour, pour in the milk mixture and stir {n} or {n1} times, until it just comes together."],
            ["Fold in the {main} and let the batter rest for {t1} minutes.", "Add the {main} and leave the batter for {t1} minutes."],
            ["Heat a frying pan over a medium heat for {t1} minutes and wipe it with a little butter.",
             "Warm a heavy pan and grease it lightly, ready for the {main} batter."],
            ["Cook {n} spoonfuls of batter at a time until bubbles appear on top, then flip and cook for another minute.",
             "Pour in small rounds of batter, turn them when the edges look set, and cook until golden."],
            ["Serve the {main} pancakes warm with {extra}.", "Keep them warm in a low oven and serve with {extra}."],
        ],
    },
}
HERBS = ["parsley", "thyme", "basil", "coriander", "chives", "mint", "dill", "rosemary"]
RECIPE_INTROS = [
    "This is the dish I make when the cupboards are nearly bare and everyone is hungry.",
    "A neighbour in {town} taught me this one, and I have made it every {season} since.",
    "It is quick, cheap and forgiving, so it is a good recipe for beginners.",
    "Children tend to like this, especially if they are allowed to help with the stirring.",
    "The quantities here are a guide; adjust them to suit what you have.",
    "I first ate something like this at a small café in {town}, and this is my attempt to recreate it.",
    "It keeps well for a couple of days and is, if anything, better the next day.",
    "Make it on a slow afternoon and the kitchen will smell wonderful.",
]
RECIPE_TIPS = [
    "If you have no {herb}, any soft green herb will do.", "Taste as you go; that is the whole secret.",
    "Leftovers keep in the fridge for two days in a covered dish.",
    "You can double the quantities easily, but use a bigger pan.",
    "Do not rush the first step; patience there gives much better flavour.",
    "A squeeze of lemon at the end brightens almost anything.",
    "Weigh the ingredients the first time, and after that you can go by eye.",
]


def recipe(c: Composer) -> str:
    kind = RECIPES[c.pick(sorted(RECIPES))]
    slots = {"main": c.pick(kind["main"]), "extra": c.pick(kind["extra"]), "herb": c.pick(HERBS),
             "n": str(c.between(2, 4)), "t1": str(c.between(3, 10)), "t2": str(c.between(5, 12)),
             "t3": str(c.pick([20, 25, 30, 35, 40, 45])), "temp": str(c.pick([160, 170, 180, 190])),
             "garlic": str(c.between(2, 4)), "oil": str(c.between(2, 4)), "pasta": str(c.pick([300, 400, 500])),
             "flour": str(c.pick([175, 200, 225, 250])), "butter": str(c.pick([125, 150, 175])),
             "sugar": str(c.pick([100, 125, 150, 175]))}
    slots["n1"] = str(int(slots["n"]) + 1)
    name = title_case(c.fill(c.pick(kind["names"]), slots))
    serves = f"Serves {c.between(2, 6)}. Takes about {c.pick([20, 30, 40, 45, 60, 75])} minutes."
    ingredients = "Ingredients:\n" + "\n".join("- " + c.fill(item, slots) for item in kind["amounts"])
    steps = [c.say(stage, slots) for stage in kind["steps"]]
    method = "Method:\n" + "\n".join(f"{i}. {step}" for i, step in enumerate(steps, 1))
    parts = [name, c.say(RECIPE_INTROS, slots) + " " + serves, ingredients, method]
    if c.chance(0.6):
        parts.append("Tip: " + c.say(RECIPE_TIPS, slots))
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# How-to guides: fixed steps per task, so each task can only be used a few times.
# ---------------------------------------------------------------------------------------------

HOW_TO = [
    ("mend a bicycle puncture", [
        "Turn the bicycle upside down and remove the wheel.",
        "Lever one side of the tyre off the rim with two tyre levers, and pull out the inner tube.",
        "Pump a little air into the tube and listen, or dip it in water and watch for bubbles.",
        "Roughen the area around the hole with sandpaper and spread a thin layer of glue.",
        "Wait until the glue is dry to the touch, then press the patch on firmly.",
        "Run your fingers carefully around the inside of the tyre to find whatever caused the puncture.",
        "Refit the tube and tyre, pump it up, and check that the tyre sits evenly on the rim."]),
    ("plant a tree", [
        "Choose a spot where the tree will have room to grow to its full size.",
        "Dig a hole as deep as the root ball and about twice as wide.",
        "Loosen the soil at the bottom and sides so the roots can spread.",
        "Set the tree in the hole so that the top of the root ball sits level with the ground.",
        "Fill in around it with the soil you dug out, firming it gently with your foot.",
        "Water it deeply, and keep watering once a week through its first dry summer."]),
    ("sharpen a kitchen knife", [
        "Soak the whetstone in water for about ten minutes, if it is the kind that needs soaking.",
        "Hold the blade at a shallow angle, roughly the height of two stacked coins at the spine.",
        "Push the blade across the stone, edge first, sweeping from heel to tip.",
        "Repeat on the same side until you can feel a slight rough lip along the opposite edge.",
        "Turn the knife over and do the same number of strokes on the other side.",
        "Finish with a few light strokes on each side, then rinse and dry the knife."]),
    ("start a vegetable patch", [
        "Pick the sunniest part of the garden, away from big trees.",
        "Clear the grass and weeds, and dig out any roots you find.",
        "Spread a thick layer of compost over the soil.",
        "Start with easy crops such as radishes, lettuce, beans and courgettes.",
        "Sow in short rows a few weeks apart, so everything is not ready at once.",
        "Water in the evening, and cover the soil between plants with straw or leaves to keep it moist."]),
    ("make a good cup of tea", [
        "Fill the kettle with fresh cold water, since water that has boiled before tastes flat.",
        "Warm the teapot with a splash of hot water and tip it away.",
        "Add one spoonful of leaves per person, and one for the pot if you like it strong.",
        "Pour on the water just after it boils for black tea, or a little cooler for green tea.",
        "Let it brew for three to five minutes, then stir once.",
        "Pour through a strainer, and add milk or lemon only after tasting."]),
    ("read a paper map", [
        "Find the key, which explains what each symbol and colour means.",
        "Check the scale, so you know how far a centimetre on the map is on the ground.",
        "Turn the map until the roads and hills in front of you line up with those on the page.",
        "Contour lines join points of the same height, and lines close together mean a steep slope.",
        "Pick out a few landmarks you can see, such as a church, a lake or a bend in the river.",
        "Keep your thumb on the map at your current position and move it as you walk."]),
    ("wash a woollen jumper", [
        "Check the label first, because some wool can only be dry cleaned.",
        "Fill a basin with lukewarm water and add a little gentle wool wash.",
        "Push the jumper under the water and squeeze it softly; never rub or wring it.",
        "Rinse it in water of the same temperature, because sudden changes make wool shrink.",
        "Roll it up in a towel and press to remove most of the water.",
        "Lay it flat to dry, pulling it gently back into shape."]),
    ("build a simple bird box", [
        "Cut a plank of untreated wood into a front, a back, two sides, a roof and a floor.",
        "Drill a hole in the front piece, about the size of a large coin for small birds.",
        "Drill a few small holes in the floor so rain can drain away.",
        "Nail the pieces together, fixing the roof with a hinge or a strip of leather so it can be lifted for cleaning.",
        "Fix the box to a tree or wall, out of direct sun and away from where cats can reach.",
        "Clean out old nesting material each autumn, after the birds have left."]),
    ("learn a poem by heart", [
        "Read the whole poem aloud several times before trying to memorise anything.",
        "Work on two lines at a time, saying them without looking until they come easily.",
        "Add the next two lines, then go back and say everything from the start.",
        "Notice the rhymes and the rhythm, because they pull the next words along.",
        "Picture each image in the poem, so the words are attached to something you can see.",
        "Practise last thing at night and again in the morning; sleep does some of the work."]),
    ("light a campfire safely", [
        "Use an existing fire ring if there is one, and check that fires are allowed.",
        "Clear away dry leaves and grass from a wide circle around it.",
        "Gather three sizes of fuel: dry tinder, thin sticks, and a few larger pieces.",
        "Build a small tent of sticks over a loose bundle of tinder, leaving gaps for air.",
        "Light the tinder from the side the wind is coming from, and add sticks slowly as it catches.",
        "When you leave, drown the fire with water, stir the ashes, and drown it again until it is cold."]),
]
HOW_TO_INTROS = [
    "Knowing how to {task} is one of those small skills that saves time and money.",
    "Nobody is born knowing how to {task}, but it is easy to learn.",
    "Here is a short guide to how to {task}, with no special equipment needed.",
    "My grandfather showed me how to {task}, and these are his steps, more or less.",
    "If you have never tried to {task}, start here.",
]
HOW_TO_OUTROS = [
    "The first time takes a while; the second time is much quicker.",
    "Take your time, and do not worry if it is not perfect at first.",
    "Once you have done it a few times, you will not need these notes at all.",
    "If something goes wrong, go back a step and try again slowly.",
]


def how_to(c: Composer) -> str | None:
    task, steps = c.pick(HOW_TO)
    if len(c.fresh(steps)) < len(steps):
        return None
    numbered = "\n".join(f"{i}. {c.use(step)}" for i, step in enumerate(steps, 1))
    slots = {"task": task}
    return "\n\n".join([title_case("how to " + task) if c.chance(0.5) else f"How to {task}",
                        c.say(HOW_TO_INTROS, slots), numbered, c.say(HOW_TO_OUTROS)])


# ---------------------------------------------------------------------------------------------
# Dialogues: scenes with ordered stages; each stage has several phrasings.
# ---------------------------------------------------------------------------------------------

SCENES = [
    {"title": "At the Bakery", "roles": ("Customer", "Baker"), "slots": {
        "bread": ["a sourdough loaf", "a rye loaf", "two seeded rolls", "a plaited loaf", "a baguette"],
        "cake": ["the plum tart", "a slice of carrot cake", "two cinnamon buns", "the lemon biscuits"]},
     "stages": [
        [("A", "Good morning! Is there any {bread} left?"), ("A", "Morning. I'm hoping you still have {bread}.")],
        [("B", "You're in luck, that's the last one."), ("B", "Just out of the oven, so careful, it's still warm."),
         ("B", "Yes, {name2} baked a fresh batch this morning.")],
        [("A", "Wonderful. And what's that on the top shelf?"), ("A", "I'll take it. Is that {cake} I can smell?")],
        [("B", "That's {cake}. My aunt's recipe, made fresh today."), ("B", "It's {cake}, and it's the best thing I make.")],
        [("A", "Then I'll have some of that too, please."), ("A", "Go on, I'll try it. How much is that altogether?")],
        [("B", "That comes to {price}, please."), ("B", "{price} altogether. Have a lovely day.")],
     ]},
    {"title": "At the Station", "roles": ("Traveller", "Clerk"), "slots": {
        "dest": TOWNS, "time": ["ten past nine", "half past two", "quarter to six", "eleven o'clock", "noon"]},
     "stages": [
        [("A", "Could I have a return ticket to {dest}, please?"), ("A", "Hello. When is the next train to {dest}?")],
        [("B", "The next one leaves at {time} from platform {n}."), ("B", "There's one at {time}, but you'll need to change at {dest2}.")],
        [("A", "Is it usually on time?"), ("A", "Do I have time to buy a coffee first?"), ("A", "Is there a quieter train later?")],
        [("B", "Mostly, though it was late twice last week."), ("B", "You've got a good twenty minutes, so yes."),
         ("B", "The later one is much quieter, but it stops everywhere.")],
        [("A", "Thanks, that's really helpful."), ("A", "Perfect. I'll take the ticket, then.")],
        [("B", "That's {price}. Platform {n}, over the bridge."), ("B", "Here you are. Have a good journey.")],
     ]},
    {"title": "In the Library", "roles": ("Reader", "Librarian"), "slots": {"book": BANK["book"]},
     "stages": [
        [("A", "Hello, I'm looking for {book}."), ("A", "Excuse me, do you have {book}?")],
        [("B", "Let me check. Yes, we have one copy, but it's on loan until {weekday}."),
         ("B", "We do. It should be upstairs, on the shelf by the window.")],
        [("A", "Could I reserve it?"), ("A", "Is there anything similar I could borrow today?")],
        [("B", "Of course. I'll just need your card."), ("B", "You might enjoy {book2}; people who like one usually like the other.")],
        [("A", "Thank you. Do you know if the reading group still meets on {weekday}s?"), ("A", "Brilliant, thanks so much.")],
        [("B", "It does, at seven. New members are always welcome."), ("B", "You're welcome. Enjoy your reading.")],
     ]},
    {"title": "Over the Garden Fence", "roles": ("{name1}", "{name2}"), "slots": {"veg": HERBS + ["beans", "lettuce", "squash"]},
     "stages": [
        [("A", "Your {veg} is looking marvellous this year."), ("A", "Morning! How are you getting on with the {veg}?")],
        [("B", "Thank you. I think it's the rain; it's been good for something at least."),
         ("B", "Not bad, but the slugs have found it.")],
        [("A", "Have you tried putting crushed eggshells around it?"), ("A", "I had the same trouble. Beer traps worked for me.")],
        [("B", "I'll give it a go. Would you like some? I've far more than I need."),
         ("B", "I might try that. Do you want a few cuttings from the rosemary in return?")],
        [("A", "I'd love some, thank you. I'll bring round some jam."), ("A", "That's kind. Come for tea on {weekday}.")],
     ]},
    {"title": "Planning a Picnic", "roles": ("{name1}", "{name2}"), "slots": {"place": STORY_BANK["place"]},
     "stages": [
        [("A", "The forecast says {weekday} will be sunny. Shall we have a picnic?"), ("A", "Let's do something outdoors this weekend.")],
        [("B", "Good idea. Where shall we go?"), ("B", "Yes, please. I've been stuck inside all week.")],
        [("A", "What about the meadow near {place}?"), ("A", "We could walk up past {place} and find a spot with a view.")],
        [("B", "Fine by me. I'll bring {food}."), ("B", "Lovely. I'll make sandwiches and bring {food}.")],
        [("A", "I'll bring a blanket and something to drink."), ("A", "And I'll pack the kite, in case there's wind.")],
        [("B", "Shall we meet at ten by the bridge?"), ("B", "Perfect. Let's not forget the sun cream this time.")],
     ]},
    {"title": "At the Repair Shop", "roles": ("Customer", "Mechanic"), "slots": {
        "thing": ["my bicycle", "this old radio", "the lawnmower", "my sewing machine", "this clock"]},
     "stages": [
        [("A", "Hello, could you have a look at {thing}? It's making a strange noise."),
         ("A", "I was hoping you could fix {thing}. It stopped working on {weekday}.")],
        [("B", "Let's see. Ah, I think I know what that is."), ("B", "Hmm. When did you last have it serviced?")],
        [("A", "Is it expensive to fix?"), ("A", "Honestly, I can't remember. Years ago, probably.")],
        [("B", "It's just a worn part, nothing serious, and it'll be about {price} including labour."),
         ("B", "It needs a good clean and a new belt. I can do it by {weekday}.")],
        [("A", "That's a relief. Shall I leave it with you?"), ("A", "Great, that's much less than I feared.")],
        [("B", "Yes, I'll ring you when it's ready."), ("B", "Leave it here, and write your number on the ticket.")],
     ]},
]


def dialogue(c: Composer) -> str | None:
    scene = c.pick(SCENES)
    name1, name2 = c.two_people()
    slots = {key: c.pick(values) for key, values in scene["slots"].items()}
    slots.update({"name1": name1, "name2": name2, "n": str(c.between(1, 9)), "dest2": c.pick(TOWNS),
                  "book2": c.pick(BANK["book"]), "food": c.pick(BANK["food"]),
                  "price": f"{c.between(2, 40)} pounds {c.between(1, 9) * 10}"})
    role = {"A": c.fill(scene["roles"][0], slots), "B": c.fill(scene["roles"][1], slots)}
    lines = []
    for stage in scene["stages"]:
        options = [(speaker, c.fill(text, slots)) for speaker, text in stage]
        options = [option for option in options if c.uses[option[1]] < MAX_USES]
        if not options:   # this scene's fixed lines are used up
            return None
        speaker, text = c.pick(options)
        lines.append(f"{role[speaker]}: {c.use(text)}")
    title = scene["title"] if c.chance(0.6) else f"{scene['title']} in {c.pick(TOWNS)}"
    return title + "\n\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Lists.
# ---------------------------------------------------------------------------------------------

LISTS = [
    ("Packing list for a weekend in the hills", [
        "waterproof jacket", "spare socks, two pairs", "map and compass", "a flask of tea", "sun hat",
        "plasters", "a head torch", "sandwiches", "a warm jumper", "a notebook", "binoculars", "a whistle"]),
    ("Things to do on a rainy day", [
        "bake something with whatever is in the cupboard", "write a letter to an old friend",
        "sort the box of photographs", "learn three card tricks", "build a blanket fort",
        "read a book from the back of the shelf", "mend the torn cushion", "start a jigsaw",
        "make a list of places to visit in summer", "try a recipe from another country"]),
    ("Shopping list", [
        "eggs", "flour", "two lemons", "a bag of onions", "milk", "porridge oats", "a jar of honey",
        "soap", "light bulbs", "string", "tomatoes", "rice", "a loaf of bread", "butter", "tea bags"]),
    ("Small habits worth keeping", [
        "drink a glass of water when you wake", "walk somewhere every day, even briefly",
        "put things back where they live", "write down one good thing each evening",
        "reply to letters within a week", "leave the kitchen tidy before bed", "learn one new word a day",
        "call someone you have not spoken to in a while", "go to bed at the same time each night"]),
    ("Birds seen from the kitchen window this {season}", [
        "blackbird", "robin", "blue tit", "great tit", "wren", "starling", "collared dove", "magpie",
        "goldfinch", "chaffinch", "house sparrow", "song thrush", "jay", "green woodpecker"]),
    ("Jobs for the garden in {month}", [
        "sweep up the leaves and add them to the compost", "sow broad beans", "prune the roses",
        "plant tulip bulbs", "clean the bird bath", "mulch the raspberries", "cut back the lavender",
        "divide the overgrown clumps of irises", "tie in the climbing beans", "net the strawberries"]),
    ("Questions to ask before buying a used bicycle", [
        "does the frame fit you", "do the brakes bite firmly", "are the wheels straight",
        "does the chain skip when you push hard", "is there rust around the joints",
        "do the gears change cleanly", "are the tyres cracked", "why is the owner selling it"]),
    ("Things I noticed on my walk today", [
        "a heron standing perfectly still in the ditch", "the first blossom on the blackthorn",
        "a child's red glove placed carefully on a fence post", "smoke rising straight up from a chimney",
        "two old men arguing happily about football", "frogspawn in the pond by the church",
        "a cat asleep in a flowerpot", "the smell of fresh bread near the station",
        "a rainbow over the allotments", "someone practising the trumpet behind an open window"]),
]
LIST_INTROS = ["", "", "Written on the back of an envelope by {name}.", "Pinned to the fridge.",
               "A note to myself, {weekday}.", "From {name}'s notebook."]


def item_list(c: Composer) -> str:
    title, items = c.pick(LISTS)
    slots = {"name": c.pick(WOMEN + MEN)}
    chosen = c.sample(items, c.between(5, min(9, len(items))))
    bullet = c.pick(["- ", "* ", "numbered"])
    rows = [f"{i}. {capitalize_first(item)}" if bullet == "numbered" else bullet + item
            for i, item in enumerate(chosen, 1)]
    head = capitalize_first(c.fill(title, slots))
    intro = c.fill(c.pick(LIST_INTROS), slots)
    return "\n\n".join(part for part in [head, intro, "\n".join(rows)] if part)


# ---------------------------------------------------------------------------------------------
# Poems: couplets drawn from groups of hand-written lines that rhyme with each other.
# ---------------------------------------------------------------------------------------------

RHYME_GROUPS = [
    ["The lamps along the harbour burning bright,", "And gulls go wheeling slowly out of sight,",
     "The fields are silver in the morning light,", "We walked together long into the night,",
     "A single star is trembling at that height,", "The swallows gather, ready for their flight,"],
    ["The boats lie quiet on the sleeping sea,", "A blackbird sings alone in the pear tree,",
     "The kettle murmurs softly, just for me,", "The wind has turned the key and set us free,",
     "And all the world is wider than we see,", "The river hums a low and steady plea,"],
    ["I heard the first soft patter of the rain,", "The fog lies thick along the narrow lane,",
     "We watched the lights go by of the late train,", "The wheat is bending low across the plain,",
     "A robin taps upon the window pane,", "And summer will, I promise, come again,"],
    ["The path winds upward over moss and stone,", "The old house settles, creaking on its own,",
     "The seeds we scattered now are fully grown,", "I found a feather that the wind had blown,",
     "A fox goes trotting home, but not alone,", "The hills keep secrets that were never known,"],
    ["The snow comes drifting down without a sound,", "The apples ripen, heavy, gold and round,",
     "The roots go searching deep beneath the ground,", "The children laugh and chase the dog around,",
     "And every lost thing, given time, is found,", "The bells ring out for all the miles around,"],
    ["The evening gathers softly in the west,", "The tired sparrow settles in her nest,",
     "The sea grows calm, the waves have gone to rest,", "Of all the seasons, autumn is the best,",
     "We kept the little letters you had pressed,", "The wind goes on its long and restless quest,"],
    ["A kite goes dancing up into the blue,", "The grass is heavy with the morning dew,",
     "The oldest songs are somehow always new,", "The baker hums and shapes the loaves in two,",
     "And every road I walk leads back to you,", "The clouds drift on, with nothing else to do,"],
    ["The moon climbs slowly over roof and hill,", "The mill wheel turns, and then the wheel is still,",
     "The cat sits watching from the window sill,", "The daffodils come nodding, yellow frill,",
     "I climb the stair with neither want nor will,", "The morning air is sharp and sweet and chill,"],
    ["The lantern flickers, and the shadows play,", "The fishing boats set out at break of day,",
     "The swallows came, and then they flew away,", "The tide comes in and takes the sand away,",
     "I did not know the words I meant to say,", "The hills turn gold, and then they turn to grey,"],
    ["The orchard hums with bees in early June,", "The children hum a half-remembered tune,",
     "The geese fly south beneath a harvest moon,", "The shadows lengthen in the afternoon,",
     "The sea will take the castle very soon,", "The day goes by, and night will follow soon,"],
]
POEM_TITLES = ["Harbour", "Evening Song", "Small Hours", "The Orchard", "Late {season_title}", "Walking Home",
               "Rain", "For {name}", "The Lane", "What the River Said", "A {season_title} Morning", "Lullaby",
               "Letter to a Friend", "Lighthouse", "Frost", "The Garden in {month}"]


def finish_line(line: str, last: bool) -> str:
    return line[:-1] + "." if last else line


def poem(c: Composer) -> str | None:
    groups = [g for g in RHYME_GROUPS if len(c.fresh(g)) >= 2]
    if len(groups) < 2:
        return None
    stanzas = []
    for _ in range(c.between(1, 3)):
        chosen = c.sample(groups, 2)
        lines = [c.use(line) for group in chosen for line in c.sample(c.fresh(group) or group, 2)]
        if c.chance(0.5):   # ABAB instead of AABB
            lines = [lines[0], lines[2], lines[1], lines[3]]
        stanzas.append("\n".join(lines))
        groups = [g for g in groups if len(c.fresh(g)) >= 2]
        if len(groups) < 2:
            break
    stanzas[-1] = finish_line(stanzas[-1], True)
    slots = {"season_title": c.pick(BANK["season"]).capitalize(), "name": c.pick(WOMEN + MEN)}
    title = c.fill(c.pick(POEM_TITLES), slots)
    signature = f"\n\n{c.pick(WOMEN + MEN)}" if c.chance(0.3) else ""
    return title + "\n\n" + "\n\n".join(stanzas) + signature


# ---------------------------------------------------------------------------------------------
# Weather reports and notices.
# ---------------------------------------------------------------------------------------------

REGIONS = ["the coast", "the northern hills", "the river valley", "inland areas", "the islands",
           "the city", "the southern farmland", "the high moors", "the eastern lowlands", "the western bays"]
WEATHER_LINES = [
    "{Region} will start {start}, with {later} by the afternoon.",
    "Expect {start} across {region}, clearing slowly from the west.",
    "For {region}, {start} at first, then {later}.",
    "{Region} can look forward to {later}, though {start} may linger early on.",
    "Along {region} the wind will freshen from the {dir}, gusting to {gust} kilometres an hour.",
    "Temperatures in {region} will reach {hi} degrees, falling to {lo} overnight.",
    "In {region}, highs of {hi} degrees and lows near {lo}, with a {dir}erly breeze.",
    "{Region} should stay mostly dry, but carry an umbrella just in case.",
    "There is a small chance of thunder over {region} late in the day.",
    "Frost is likely in sheltered parts of {region} before dawn.",
]
WEATHER_TEMPERATURES = [
    "Across {region} the top temperature will be {hi} degrees, with {lo} degrees expected after dark.",
    "Expect {hi} degrees at best in {region}, dropping to around {lo} degrees by morning.",
    "Temperatures peak at {hi} degrees in {region} this afternoon, with a low of {lo} degrees tonight.",
]
WEATHER_STARTS = ["grey and damp", "bright and cold", "misty", "breezy with some sunshine", "overcast",
                  "wet, with heavy bursts of rain", "calm and clear", "cloudy but mild"]
WEATHER_LATERS = ["sunny spells", "scattered showers", "long clear spells", "thickening cloud",
                  "a band of steady rain", "a few sharp hail showers", "gentle drizzle", "warm sunshine"]
WEATHER_OUTLOOKS = [
    "The weekend looks settled, with plenty of sunshine and light winds.",
    "Looking further ahead, an unsettled spell is likely, with rain at times.",
    "Later in the week, high pressure should bring calmer and drier weather.",
    "The outlook is changeable: sunshine one day, showers the next.",
    "A colder spell is expected next week, with a risk of snow on high ground.",
    "It should turn milder from {weekday}, though with more cloud.",
]


def weather_report(c: Composer) -> str:
    day = f"{c.pick(BANK['weekday'])} {c.between(1, 28)} {c.pick(BANK['month'])}"
    lines = []
    for region in c.sample(REGIONS, c.between(3, 5)):
        hi = c.between(-2, 28)
        slots = {"region": region, "Region": capitalize_first(region), "start": c.pick(WEATHER_STARTS),
                 "later": c.pick(WEATHER_LATERS), "dir": c.pick(["north", "south", "east", "west"]),
                 "gust": str(c.between(3, 12) * 5), "hi": str(hi), "lo": str(hi - c.between(3, 10))}
        lines.append(c.say(WEATHER_LINES, slots))
    lines.append(c.say(WEATHER_TEMPERATURES, slots))
    header = c.pick([f"Weather for {day}", f"The {c.pick(TOWNS)} Forecast, {day}", f"Forecast: {day}"])
    return "\n\n".join([header, paragraph(lines), c.say(WEATHER_OUTLOOKS)])


NOTICE_LINES = [
    "The {town} {club} meets every {weekday} at {hour} in {venue}; newcomers are very welcome.",
    "Lost: {object} somewhere between {venue} and the station. Please ring {name} if found.",
    "Found: {object} on a bench near {venue}; collect from the front desk on {weekday}.",
    "The {club} is looking for volunteers to help with the summer fair.",
    "Please note that {venue} will be closed on {weekday} for repairs to the roof.",
    "Our annual bring-and-share supper will be held on {weekday} {day} {month}. Bring a dish to share and a friend from {town}.",
    "Thank you to everyone who donated books; we raised enough to buy the {club} a new set of chairs.",
    "The footpath behind {venue} is muddy after the rain, so please keep to the boards until {weekday}.",
    "Children's story time is now on {weekday} mornings at ten.",
    "Free bicycle checks outside {venue} on {weekday}, from {hour} until the tea runs out.",
    "A talk on {topic} will be given by {name} on {weekday} at {hour}. Tea and biscuits afterwards.",
    "Offered: cuttings from {name}'s very old fig tree; leave a note in the box by {venue}.",
]
NOTICE_BANK = {
    "club": ["Walking Club", "Choir", "Chess Club", "Garden Society", "Repair Café", "Film Club",
             "Knitting Circle", "Astronomy Group", "History Society", "Book Group"],
    "venue": ["the village hall", "the library", "the community centre", "the church room", "the old school",
              "the boathouse", "the sports pavilion"],
    "hour": ["seven", "half past six", "ten in the morning", "two o'clock", "eight"],
}


def notices(c: Composer) -> str:
    slots = {key: c.pick(values) for key, values in NOTICE_BANK.items()}
    town = c.pick(TOWNS)
    lines = []
    for template in c.sample(NOTICE_LINES, c.between(3, 5)):   # distinct kinds of notice
        slots.update(name=c.pick(WOMEN + MEN), object=c.pick(STORY_BANK["object"]),
                     venue=c.pick(NOTICE_BANK["venue"]), day=str(c.between(1, 28)),
                     topic=c.pick(TOPICS)["subject"], town=town)
        lines.append("- " + c.say([template], slots))
    return f"Notices from {town}\n\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Assembly.
# ---------------------------------------------------------------------------------------------

GENRES = [  # (document maker, relative weight)
    (explainer, 8), (story, 5), (letter, 3), (recipe, 3), (questions_and_answers, 3), (dialogue, 3),
    (item_list, 1), (poem, 2), (weather_report, 2), (diary, 2), (notices, 1), (how_to, 1), (fable, 2),
]


def build_corpus(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    """The whole corpus as one string: documents joined by DOCUMENT_SEPARATOR, ending in a newline."""
    composer = Composer(seed)
    makers = [maker for maker, _ in GENRES]
    weights = [weight for _, weight in GENRES]
    documents: list[str] = []
    size = 0
    while size < target_bytes:
        document = composer.rng.choices(makers, weights)[0](composer)
        if document is None:   # that kind has used up its fresh material
            continue
        documents.append(document)
        size += len(document.encode("utf-8")) + len(DOCUMENT_SEPARATOR)
    return DOCUMENT_SEPARATOR.join(documents) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the built-in corpus (deterministic).")
    parser.add_argument("--output", type=Path, default=OUTPUT_PATH,
                        help=f"where to write it (default: {OUTPUT_PATH.name} next to this script)")
    args = parser.parse_args(argv)
    data = build_corpus().encode("utf-8")
    args.output.write_bytes(data)
    print(f"wrote {args.output} ({len(data)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Shared vocabulary of the person-attribute tasks (`paraphrase`, `coref`, `aggregate`).

A `Relation` is one attribute of a person ("can play the cello"). Its evidence `templates` have a subject
slot {S} (a full name, a pronoun or a nickname), the value {v} and its article {an}. Three questions go with
it: `ask` names the relation in the templates' own words (each template shares a content word with it),
`para` paraphrases it for one person and `agg` for everyone in the notes; neither shares a content word
(`select.lexical.content_words`) with any template or any value, so word overlap cannot find the evidence.
Values are disjoint across relations and whole words never repeat between values, so an answer string
occurs in an episode only where it is stated. Names and nicknames are disjoint from `facts` (whose office
filler these tasks reuse); `test_tasks_people.py` checks all of this.
"""
from __future__ import annotations

import random
from typing import NamedTuple


class Relation(NamedTuple):
    name: str
    templates: tuple[str, ...]  # evidence sentences: {S} subject, {v} value, {an} "a"/"an" for the value
    ask: str  # direct question ({person}): shares relation words with every template
    para: str  # paraphrase question ({person}): no content word in common with the templates or values
    agg: str  # collective paraphrase question over all the people in the notes
    values: tuple[str, ...]
    alias: str = ""  # a second answer form, e.g. "{v} Street"


def _v(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(","))


EVERYONE = "the people mentioned"
RELATIONS = (
    Relation("hometown", ("{S} was born in {v}.", "{S} was born and raised in {v}."),
             "Where was {person} born?", "What is the hometown of {person}?",
             f"What are the hometowns of {EVERYONE}?",
             _v("Tbilisi, Mombasa, Cusco, Hobart, Quebec, Galway, Salzburg, Bruges, Verona, Dubrovnik, Sapporo, "
                "Adelaide, Halifax, Marrakesh, Tromso, Reykjavik, Antwerp, Lucerne, Granada, Palermo, Nairobi, "
                "Kyoto, Cordoba, Winnipeg")),
    Relation("instrument", ("{S} can play the {v}.", "{S} learned to play the {v} as a child."),
             "Which instrument can {person} play?", "Which musical instrument does {person} practise?",
             f"Which musical instruments do {EVERYONE} practise?",
             _v("cello, violin, viola, oboe, clarinet, bassoon, trumpet, trombone, tuba, flute, piccolo, banjo, "
                "mandolin, ukulele, accordion, harmonica, saxophone, xylophone, harpsichord, bagpipes, sitar, "
                "marimba, double bass, zither")),
    Relation("occupation", ("{S} has a job as {an} {v}.", "{S} took a job as {an} {v} two years ago."),
             "What job does {person} have?", "What is the occupation of {person}?",
             f"What are the occupations of {EVERYONE}?",
             _v("carpenter, plumber, electrician, pharmacist, architect, librarian, firefighter, surveyor, "
                "paramedic, veterinarian, locksmith, beekeeper, glassblower, cartographer, translator, midwife, "
                "upholsterer, jeweller, optician, stonemason, blacksmith, tailor, baker, florist")),
    Relation("beverage", ("{S} drinks {v} every morning.", "Every morning {S} drinks a large mug of {v}."),
             "What does {person} drink every morning?", "Which beverage starts {person}'s day?",
             f"Which beverages start the day for {EVERYONE}?",
             _v("espresso, cocoa, chamomile, kombucha, matcha, buttermilk, rooibos, kefir, lemonade, ginger ale, "
                "oat milk, yerba mate, carrot juice, cappuccino, horchata, lassi, ayran, mocha, hibiscus, sencha, "
                "ristretto, cortado")),
    Relation("language", ("{S} can speak {v} fluently.", "{S} learned to speak {v} while living abroad."),
             "Which language can {person} speak fluently?", "Which foreign tongue has {person} mastered?",
             f"Which foreign tongues have {EVERYONE} mastered?",
             _v("Finnish, Icelandic, Swahili, Tagalog, Hungarian, Estonian, Georgian, Armenian, Welsh, Basque, "
                "Catalan, Maltese, Latvian, Lithuanian, Slovak, Bengali, Urdu, Tamil, Amharic, Yoruba, Mongolian, "
                "Khmer, Burmese, Albanian")),
    Relation("pet", ("{S} adopted {an} {v} from the shelter.",
                     "{S} adopted {an} {v} from the animal shelter last year."),
             "Which animal did {person} adopt from the shelter?", "Which creature keeps {person} company at home?",
             f"Which creatures keep {EVERYONE} company at home?",
             _v("beagle, dachshund, poodle, greyhound, terrier, ferret, hamster, parrot, tortoise, rabbit, "
                "guinea pig, chinchilla, iguana, cockatoo, budgie, gecko, hedgehog, corgi, spaniel, collie, canary, "
                "axolotl, tabby cat, husky")),
    Relation("pastime", ("{S} goes {v} most weekends.", "Most weekends {S} goes {v} with friends."),
             "What does {person} do most weekends?", "Which outdoor pastime fills {person}'s free time?",
             f"Which outdoor pastimes fill the free time of {EVERYONE}?",
             _v("sailing, kayaking, rowing, surfing, skiing, snowboarding, wild swimming, canoeing, bouldering, "
                "orienteering, abseiling, paragliding, snorkelling, caving, birdwatching, geocaching, skating, "
                "fishing, hiking, kite flying, foraging, trail running, scuba diving, horse riding")),
    Relation("meal", ("{S} cooks {v} for friends on Sundays.", "On Sundays {S} cooks {v} for the whole family."),
             "What does {person} cook on Sundays?", "Which meal does {person} prepare as a weekend treat?",
             f"Which meals do {EVERYONE} prepare as a weekend treat?",
             _v("paella, moussaka, goulash, ratatouille, pierogi, couscous, gnocchi, falafel, dumplings, ramen, "
                "bibimbap, tagine, shakshuka, borscht, jambalaya, gumbo, enchiladas, empanadas, biryani, fondue, "
                "quiche, pad thai, stroganoff, carbonara")),
    Relation("car", ("{S} drives an old {v} to the office.", "{S} drives a secondhand {v} to the office."),
             "What does {person} drive to the office?", "Which vehicle brand does {person} own?",
             f"Which vehicle brands do {EVERYONE} own?",
             _v("Volvo, Saab, Peugeot, Renault, Citroen, Fiat, Skoda, Mercedes, Trabant, Jeep, Land Rover, Subaru, "
                "Mazda, Toyota, Honda, Nissan, Opel, Alfa Romeo, Lancia, Dacia, Hyundai, Porsche, Cadillac, "
                "Chevrolet")),
    Relation("door", ("{S} painted the front door {v}.", "{S} painted the front door a bright shade of {v}."),
             "What colour did {person} paint the front door?", "Which hue did {person} pick for the house entrance?",
             f"Which hues did {EVERYONE} pick for their house entrances?",
             _v("crimson, turquoise, maroon, teal, lilac, mustard, indigo, magenta, ochre, scarlet, charcoal, "
                "burgundy, coral, cobalt, amber, emerald, beige, mauve, navy, ivory, vermilion, cerulean, taupe")),
    Relation("author", ("{S} is reading a novel by {v}.", "{S} has just finished a novel by {v}."),
             "Which author wrote the novel {person} is reading?", "Whose books sit on {person}'s bedside table?",
             f"Whose books sit on the bedside tables of {EVERYONE}?",
             _v("Tolstoy, Dickens, Austen, Kafka, Orwell, Tolkien, Hemingway, Steinbeck, Nabokov, Dostoevsky, "
                "Chekhov, Woolf, Borges, Camus, Zola, Flaubert, Balzac, Goethe, Cervantes, Melville, Twain, "
                "Faulkner, Proust, Murakami")),
    Relation("degree", ("{S} studied {v} at university.", "{S} earned a university degree in {v}."),
             "What subject did {person} study at university?", "Which academic field did {person} major in?",
             f"Which academic fields did {EVERYONE} major in?",
             _v("geology, chemistry, botany, linguistics, philosophy, economics, astronomy, archaeology, "
                "anthropology, mathematics, zoology, theology, sociology, oceanography, meteorology, criminology, "
                "musicology, genetics, ecology, physics, history, law, psychology, statistics")),
    Relation("garden", ("{S} grows {v} in the back garden.", "{S} grows {v} on the balcony."),
             "What grows in {person}'s garden?", "Which plants does {person} tend?",
             f"Which plants do {EVERYONE} tend?",
             _v("tulips, roses, sunflowers, orchids, dahlias, peonies, lavender, tomatoes, strawberries, chillies, "
                "marigolds, geraniums, begonias, ferns, cacti, pumpkins, courgettes, rhubarb, basil, rosemary, "
                "hydrangeas, camellias, lilies, daffodils")),
    Relation("summer", ("{S} spent last summer in {v}.", "{S} spent last summer travelling around {v}."),
             "Where did {person} spend last summer?", "Which destination did {person} visit on holiday?",
             f"Which destinations did {EVERYONE} visit on holiday?",
             _v("Patagonia, Madagascar, Tasmania, Sardinia, Crete, Sicily, Corsica, Bali, Borneo, Lapland, Tuscany, "
                "Provence, Andalusia, Cappadocia, Bavaria, Normandy, Scotland, Norway, Peru, Chile, Vietnam, "
                "Cambodia, Morocco, Portugal")),
    Relation("allergy", ("{S} is allergic to {v}.", "{S} has been allergic to {v} since childhood."),
             "What is {person} allergic to?", "What triggers a reaction in {person}?",
             f"What triggers a reaction in each of {EVERYONE}?",
             _v("peanuts, shellfish, pollen, penicillin, latex, wasps, walnuts, sesame, soy, gluten, kiwis, celery, "
                "lupin, feathers, mould, nickel, aspirin, almonds, hazelnuts, eggs, pineapple, mango, avocado, "
                "horses, bee stings")),
    Relation("fear", ("{S} is terrified of {v}.", "{S} has always been terrified of {v}."),
             "What is {person} terrified of?", "What frightens {person} most?",
             f"What frightens {EVERYONE} most?",
             _v("spiders, snakes, heights, thunder, clowns, needles, crowds, moths, pigeons, bats, sharks, wolves, "
                "ghosts, tunnels, bridges, balloons, owls, jellyfish, crocodiles, scorpions, hornets, rats, "
                "mirrors, escalators")),
    Relation("collection", ("{S} has a large collection of {v}.", "{S} keeps a collection of {v} in the attic."),
             "What is in {person}'s collection?", "Which objects does {person} hoard as a hobby?",
             f"Which objects do {EVERYONE} hoard as a hobby?",
             _v("stamps, coins, postcards, seashells, vinyl records, fossils, matchboxes, teapots, thimbles, "
                "keyrings, snow globes, antique maps, pocket watches, beer mats, model trains, fountain pens, "
                "tin soldiers, butterflies, marbles, minerals, bottle caps, playing cards, vintage cameras, "
                "porcelain dolls")),
    Relation("volunteer", ("{S} volunteers at the {v} on Saturdays.", "On Saturdays {S} volunteers at the {v}."),
             "Where does {person} volunteer on Saturdays?", "Which place benefits from {person}'s unpaid help?",
             f"Which places benefit from the unpaid help of {EVERYONE}?",
             _v("hospice, museum, abbey, aquarium, lifeboat station, youth club, hospital, planetarium, observatory, "
                "charity shop, orphanage, cathedral, stables, lighthouse, nature reserve, hostel, primary school, "
                "art gallery, bird sanctuary, food bank, puppet theatre, monastery")),
    Relation("baking", ("{S} is famous for baking {v}.", "{S} loves baking {v} for friends."),
             "What is {person} famous for baking?", "Which sweet things come out of {person}'s oven?",
             f"Which sweet things come out of the ovens of {EVERYONE}?",
             _v("cheesecakes, strudels, baklava, tiramisu, pavlovas, brownies, flapjacks, macarons, eclairs, "
                "profiteroles, trifles, crumbles, gingerbread, scones, muffins, doughnuts, meringues, churros, "
                "panettone, croissants, waffles, pancakes, custard tarts, shortbread, cinnamon rolls")),
    Relation("mountain", ("{S} has climbed {v}.", "{S} once climbed {v} with a guide."),
             "Which mountain has {person} climbed?", "Which summit has {person} reached on foot?",
             f"Which summits have {EVERYONE} reached on foot?",
             _v("Kilimanjaro, Aconcagua, Elbrus, Denali, Mount Fuji, Olympus, Kazbek, Vesuvius, Snowdon, Ben Nevis, "
                "Triglav, Zugspitze, Mont Blanc, Toubkal, Kinabalu, Rainier, Teide, Stromboli, Ararat, Annapurna, "
                "Kosciuszko, Everest, Grossglockner, Stetind")),
    Relation("dance", ("{S} takes {v} lessons every week.", "{S} has signed up for {v} lessons this autumn."),
             "Which dance lessons does {person} take?", "Which style of dancing is {person} learning?",
             f"Which styles of dancing are {EVERYONE} learning?",
             _v("tango, salsa, flamenco, ballet, waltz, foxtrot, samba, rumba, tap, bachata, merengue, polka, "
                "quickstep, jive, zumba, hip hop, breakdance, ceilidh, bolero, mambo, charleston, paso doble, "
                "swing, kizomba")),
    Relation("tattoo", ("{S} has a tattoo of {an} {v} on one arm.", "{S} got a tattoo of {an} {v} last spring."),
             "What is the tattoo on {person}'s arm?", "Which image is inked on {person}'s skin?",
             f"Which images are inked on the skin of {EVERYONE}?",
             _v("dragon, phoenix, griffin, tiger, lynx, anchor, compass, lotus, skull, swallow, octopus, whale, "
                "badger, dolphin, hummingbird, stag, koi carp, raven, seahorse, mermaid, unicorn, jaguar, panther, "
                "kraken")),
    Relation("street", ("{S} lives on {v} Street.", "{S} rents a flat on {v} Street."),
             "On which street does {person} live?", "What is {person}'s home address?",
             f"What are the home addresses of {EVERYONE}?",
             _v("Maple, Elm, Birch, Willow, Chestnut, Cedar, Juniper, Hawthorn, Rowan, Alder, Aspen, Poplar, "
                "Sycamore, Linden, Magnolia, Laurel, Beech, Cypress, Acacia, Spruce, Larch, Yew, Oak, Myrtle"),
             alias="{v} Street"),
    Relation("sailboat", ("{S} owns a sailboat called {v}.", "{S} keeps a sailboat named {v} at the marina."),
             "What is {person}'s sailboat called?", "What is painted on the hull of {person}'s vessel?",
             f"What is painted on the hulls of the vessels of {EVERYONE}?",
             _v("Albatross, Seagull, Neptune, Poseidon, Calypso, Odyssey, Valkyrie, Serenity, Endeavour, Voyager, "
                "Pelican, Sandpiper, Kingfisher, Cormorant, Moonbeam, Stardust, Wanderer, Nomad, Marlin, "
                "Barracuda, Tempest, Zephyr, Aurora, Halcyon")),
)
BY_NAME = {r.name: r for r in RELATIONS}

# Disjoint from facts.FIRST / facts.LAST / facts.NAMES; (first name, pronoun).
FIRST = tuple((n, "she") for n in _v(
    "Agnes, Beatrix, Cecilia, Dorota, Edith, Frida, Gisela, Helga, Ingrid, Johanna, Katya, Lotte, Magda, "
    "Nadia, Ottilie, Petra, Ruth, Sabine, Theresa, Ursula, Valeria, Zofia, Amelie, Britta")) + tuple(
    (n, "he") for n in _v(
        "Arne, Bernard, Casimir, Dmitri, Erik, Florian, Gustav, Henrik, Ivo, Jakob, Konrad, Leopold, Marek, "
        "Niklas, Otto, Piotr, Rainer, Sven, Teodor, Ulrich, Valentin, Walter, Xaver, Yannick"))
LAST = _v("Abbott, Brandt, Castellano, Dvorak, Eriksen, Falk, Gallagher, Holm, Ibsen, Jovanovic, Keller, Lund, "
          "Mancini, Olsen, Pereira, Rasmussen, Schulz, Toivonen, Vidal, Wolff, Yilmaz, Zeller, Barros, Carvalho, "
          "Dahl, Engel, Ferreira, Grimaldi, Hale, Kovac, Lorenz, Molnar, Nyberg, Ortiz")
NICKNAMES = _v("Birdie, Ace, Sunny, Pip, Ziggy, Moose, Scout, Bean, Dot, Tink, Buzz, Chip, Goose, Jazz, "
               "Kit, Noodle, Pickle, Rocky, Sparky, Bubbles, Coco, Dusty, Fizz, Mouse, Pepper, Shorty, Slim, "
               "Smiley, Twig, Whiz, Bunny")
# Opening sentences of a person's paragraph (coref): no relation words, no values.
INTROS = ("{name} moved to the neighbourhood in {year}.", "{name} joined the residents' association in {year}.",
          "{name} has lived in the building on the corner since {year}.",
          "{name} started helping at the community centre in {year}.")
INTROS_NICK = ("{name}, whom everyone calls {nick}, joined the choir in {year}.",
               "{name}, known to friends as {nick}, moved to the neighbourhood in {year}.",
               "{name}, or {nick} as the neighbours say, has lived in the building on the corner since {year}.")


class Person(NamedTuple):
    first: str
    last: str
    pronoun: str  # "she" / "he"

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


def cast(rng: random.Random, k: int) -> list[Person]:
    """`k` people with distinct first and last names."""
    return [Person(f, l, p) for (f, p), l in zip(rng.sample(FIRST, k), rng.sample(LAST, k))]


def say(template: str, subject: str, value: str) -> str:
    """A template filled in; the subject is capitalised when it opens the sentence (a pronoun)."""
    if template.startswith("{S}"):
        subject = subject[0].upper() + subject[1:]
    an = "an" if value[0].lower() in "aeiou" and not value.lower().startswith("uni") else "a"
    return template.format(S=subject, v=value, an=an)


def answers(rel: Relation, value: str) -> list[str]:
    return [value] + ([rel.alias.format(v=value)] if rel.alias else [])

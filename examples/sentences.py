"""Example inputs shown in the UI: the project's own sentences."""

TRANSLATE = [
    "A man in a blue shirt is riding a bicycle down the street.",
    "Two young girls are playing with a dog in the park.",
    "A woman is cooking dinner in a small kitchen.",
    "Three children are jumping into a swimming pool.",
]

SENTIMENT = [
    "a warm , funny and beautifully acted film .",
    "the plot is thin and the jokes fall flat .",
    "not bad at all , though the ending drags .",
]

TOPIC = [
    "The central bank raised interest rates again on Tuesday, citing stubborn inflation.",
    "The striker scored twice as the home side won the cup final in extra time.",
    "Researchers unveiled a faster chip that could make laptops run for days on one charge.",
    "Leaders of both countries met for talks on the border dispute and a possible ceasefire.",
]

"""Planted unsafe documents and labelled rows for measuring kiln's harmful-content filters.

`planted(seed, per_kind)` writes adult spam, abusive comment-section posts and casino/betting spam in English,
French, German and Spanish; `labelled` mixes them with clean texts the caller supplies into training rows for
the bag-of-ngrams classifier. Each text is put together from templates written natively per language and
kind, in a random order and number, with names, cities, brands and numbers filled at random: documents vary
enough that a classifier trained on one seed is tested on new text from another seed, while both seeds draw on
the same templates and vocabulary, so the benchmark measures what a filter does on this kind of text.
Within each language and kind, document `i` carries profanity from that language's list when `i` is even and
none when `i` is odd; an adult document's URL carries adult terms when `i % 4` is 0 or 1 and looks neutral
otherwise; hate and gambling URLs never carry adult terms. So the word list, the URL filter and the classifier
each have documents only they can catch.
Not covered: real web pages, other languages, misspelt or obfuscated words (`f*ck`), slurs against
protected groups, phishing or malware pages, URLs inside the text, and pages that mix clean and unsafe text.
"""

from __future__ import annotations

import csv
import json
import random
import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LANGUAGES = ("en", "fr", "de", "es")
KINDS = ("adult", "hate", "gambling")


@dataclass(frozen=True)
class _Pools:
    """One language's templates for one kind: headlines (openers for hate), body sentences, sentences
    with profanity (only in documents meant to carry it) and closings (calls to action, threats)."""

    heads: tuple[str, ...]
    body: tuple[str, ...]
    profane: tuple[str, ...]
    close: tuple[str, ...]


_TEXTS: dict[str, dict[str, _Pools]] = {
    "en": {
        "adult": _Pools(
            heads=(
                "Hot singles in {city} want to meet you tonight",
                "{count} new adult videos added this week, all of them free",
                "Lonely wives in {city} are online right now",
                "Uncensored private shows: {n} models live at this very moment",
                "Adults only: the naughtiest clips of {year} in full HD",
                "{name}, {age}, is waiting for your message",
            ),
            body=(
                "Our members upload {n} new clips every single day, and every one of them is uncensored.",
                "{name} from {city} just went live and she is asking for you by name.",
                "No credit card, no registration, no limits: just click and watch.",
                "Thousands of naughty girls are online right now and they want to chat with you in private.",
                "Tired of boring dates? Here you meet real women who know exactly what they want.",
                "Browse more than {count} steamy videos sorted by category, length and rating.",
                "Every private show is streamed in HD and nobody will ever know you were here.",
                "Over {count} lonely women in your area signed up this month.",
                "Our webcam models answer in less than {min} minutes, day and night.",
                "Forget dating apps: here the ladies make the first move.",
                "The clips you cannot find anywhere else are waiting behind this link.",
                "Naked housewives from {city} uploaded {n} new photo sets today.",
                "Turn on your camera and {name} will show you everything she promised.",
                "This page contains explicit material for adults over 18 only.",
                "Join the {count} men who already discovered our secret club.",
            ),
            profane=(
                "Watch horny sluts get fucked hard in {n} brand new hardcore videos.",
                "Real amateur girls show their wet pussy live on cam, no fake stuff.",
                "Free porn, big tits and nonstop fucking, updated every hour.",
                "{name} is a dirty slut who wants to fuck a stranger from {city} tonight.",
                "The nastiest cumshots and the wildest porn scenes on the whole web, all in one place.",
                "Busty camgirls masturbating live for tips, come and see for yourself.",
            ),
            close=(
                "Click here to enter now, it takes less than {min} minutes.",
                "Sign up free today and get {n} private shows on us.",
                "Enter the members area now: this offer ends at midnight.",
                "Confirm you are over 18 and start watching immediately.",
                "Send {name} a message now before someone else does.",
                "Do not wait, only {n} free memberships are left today!",
            ),
        ),
        "hate": _Pools(
            heads=(
                "@{user} you are the dumbest person I have ever seen on this forum.",
                "Reply to {user}: nobody wants to read your garbage anymore.",
                "{user}, every comment you write makes this thread worse.",
                "Oh look, {user} is back with another brain-dead take.",
            ),
            body=(
                "People like you should not be allowed anywhere near a keyboard.",
                "You are a parasite and a waste of oxygen, and everybody here knows it.",
                "Crawl back under whatever rock you came from.",
                "Nobody here respects you, nobody likes you, and nobody ever will.",
                "You are subhuman garbage pretending to have opinions.",
                "I have read {n} of your posts and every single one of them was worthless.",
                "Your family must be ashamed of the pathetic loser you turned into.",
                "Go away and never come back, you worthless idiot.",
                "Vermin like you ruin every community they touch.",
                "You are too stupid to understand a single word of this article.",
            ),
            profane=(
                "Shut the fuck up, nobody asked for your shit opinion.",
                "Go fuck yourself, you pathetic piece of shit.",
                "You absolute asshole, do the world a favour and log off forever.",
                "What a fucking moron, I cannot believe people like you exist.",
                "Get lost, you miserable bastard, and take your bullshit with you.",
            ),
            close=(
                "Keep posting and you will regret it, I promise you that.",
                "I know which town you live in, so watch your back.",
                "Say that again and I will make sure you never show your face here again.",
                "You will get what is coming to you, {user}, sooner than you think.",
                "Log off now before someone shuts you up for good.",
            ),
        ),
        "gambling": _Pools(
            heads=(
                "Win big tonight at {brand} Casino: {pct}% bonus up to ${bonus}",
                "{spins} free spins are waiting for you, no deposit needed",
                "Guaranteed winnings every day with our new betting system",
                "Jackpot alert: ${count} paid out to players this week",
                "The {brand} welcome bonus is back for {hours} hours only",
            ),
            body=(
                "New players get a {pct}% match on their first deposit, up to ${bonus}.",
                "Spin the reels on more than {games} slot games without downloading anything.",
                "Last week {player} from {city} turned a $10 bet into ${bigwin} on a single spin.",
                "Our experts share sure-win football tips every morning before kickoff.",
                "Withdrawals are paid out in under {hours} hours, no questions asked.",
                "Play blackjack, roulette and poker with live dealers around the clock.",
                "Thousands of players already make money from home with our betting app.",
                "The odds are boosted on every match this weekend, so you simply cannot lose.",
                "Your free spins are credited the moment you confirm your email.",
                "Bet on football, tennis and horse racing with the best odds in the country.",
                "Every Friday we give away {spins} extra spins to our loyal members.",
                "This is not luck, it is a system that beats the bookmakers every time.",
            ),
            profane=(),
            close=(
                "Use bonus code {code} at sign-up and claim your reward now.",
                "Register in {min} minutes and start winning today.",
                "Enter code {code} and double your first deposit instantly.",
                "Hurry, this offer expires in {hours} hours.",
                "18+ only. Terms apply. Play now and win big!",
            ),
        ),
    },
    "fr": {
        "adult": _Pools(
            heads=(
                "Des célibataires chaudes de {city} veulent te rencontrer ce soir",
                "{count} nouvelles vidéos pour adultes ajoutées cette semaine, toutes gratuites",
                "{name}, {age} ans, t'attend en direct sur sa webcam",
                "Réservé aux adultes : les vidéos les plus coquines de {year} en HD",
                "Des femmes mariées de {city} cherchent une aventure discrète",
            ),
            body=(
                "Chaque jour, nos membres publient {n} nouvelles vidéos sans aucune censure.",
                "{name} vient de se connecter depuis {city} et elle te réclame en privé.",
                "Pas de carte bancaire, pas d'inscription, aucune limite : un clic et c'est parti.",
                "Des milliers de femmes coquines sont en ligne en ce moment et n'attendent que toi.",
                "Marre des rencontres ennuyeuses ? Ici, les femmes savent exactement ce qu'elles veulent.",
                "Plus de {count} vidéos torrides classées par catégorie, durée et popularité.",
                "Tous les shows privés sont diffusés en HD et personne ne saura jamais que tu es venu.",
                "Plus de {count} femmes seules de ta région se sont inscrites ce mois-ci.",
                "Nos modèles webcam répondent en moins de {min} minutes, de jour comme de nuit.",
                "Oublie les applis de rencontre : ici, ce sont elles qui font le premier pas.",
                "Les scènes que tu ne trouveras nulle part ailleurs t'attendent derrière ce lien.",
                "Allume ta caméra et {name} te montrera tout ce qu'elle t'a promis.",
                "Contenu explicite strictement réservé aux personnes majeures.",
                "Rejoins les {count} hommes qui ont déjà découvert notre club secret.",
            ),
            profane=(
                "Des salopes en chaleur qui veulent baiser avec des inconnus, en direct et sans tabou.",
                "{name} est une vraie salope de {city} qui cherche un mec pour la baiser ce soir.",
                "Des vidéos de cul gratuites et des chattes épilées en gros plan, mises à jour toutes les heures.",
                "Regarde des salopes se faire tringler dans {n} nouvelles vidéos porno.",
                "Des amatrices chaudes se caressent devant la webcam : viens les voir jouir en direct.",
            ),
            close=(
                "Clique ici pour entrer, ça prend moins de {min} minutes.",
                "Inscris-toi gratuitement aujourd'hui et profite de {n} shows privés offerts.",
                "Entre dans l'espace membres maintenant : l'offre se termine à minuit.",
                "Confirme que tu as plus de 18 ans et commence à regarder tout de suite.",
                "Envoie vite un message à {name} avant qu'un autre ne le fasse.",
                "Dépêche-toi, il ne reste que {n} accès gratuits aujourd'hui !",
            ),
        ),
        "hate": _Pools(
            heads=(
                "@{user} t'es vraiment la personne la plus bête de tout ce forum.",
                "Réponse à {user} : personne n'a envie de lire tes âneries.",
                "{user}, chacun de tes commentaires rend ce fil encore plus pénible.",
                "Tiens, revoilà {user} avec encore un avis complètement débile.",
            ),
            body=(
                "Les gens comme toi ne devraient même pas avoir le droit de toucher un clavier.",
                "Tu es un parasite, un gaspillage d'oxygène, et tout le monde ici le sait.",
                "Retourne sous le caillou d'où tu es sorti.",
                "Personne ici ne te respecte, personne ne t'aime et ça ne changera jamais.",
                "T'es une ordure qui se prend pour quelqu'un d'intelligent.",
                "J'ai lu {n} de tes messages et pas un seul ne valait quoi que ce soit.",
                "Ta famille doit avoir honte du minable que tu es devenu.",
                "Dégage et ne reviens jamais, espèce d'abruti.",
                "Les nuisibles comme toi pourrissent toutes les communautés où ils passent.",
                "T'es trop stupide pour comprendre un seul mot de cet article.",
            ),
            profane=(
                "Ferme ta gueule, personne ne t'a demandé ton avis de merde.",
                "Va te faire foutre, pauvre connard.",
                "Espèce de sale enfoiré, rends service à tout le monde et supprime ton compte.",
                "Putain, quel abruti, j'arrive pas à croire que des gens comme toi existent.",
                "Casse-toi, fils de pute, et emporte tes conneries avec toi.",
            ),
            close=(
                "Continue à poster et tu vas le regretter, je te le promets.",
                "Je sais dans quelle ville tu habites, alors fais gaffe à toi.",
                "Répète ça encore une fois et je m'assure que tu ne remettes plus jamais les pieds ici.",
                "Tu vas avoir ce que tu mérites, {user}, et plus vite que tu ne le crois.",
                "Déconnecte-toi avant que quelqu'un te fasse taire pour de bon.",
            ),
        ),
        "gambling": _Pools(
            heads=(
                "Gagnez gros ce soir sur {brand} Casino : bonus de {pct} % jusqu'à {bonus} €",
                "{spins} tours gratuits vous attendent, sans dépôt",
                "Des gains garantis chaque jour avec notre nouvelle méthode de paris",
                "Alerte jackpot : {count} € versés aux joueurs cette semaine",
                "Le bonus de bienvenue {brand} est de retour pour {hours} heures seulement",
            ),
            body=(
                "Les nouveaux joueurs reçoivent {pct} % de bonus sur leur premier dépôt, jusqu'à {bonus} €.",
                "Faites tourner les rouleaux de plus de {games} machines à sous, sans rien télécharger.",
                "La semaine dernière, {player} de {city} a transformé une mise de 10 € en {bigwin} € en un seul tour.",
                "Nos experts partagent chaque matin des pronostics de foot sûrs à cent pour cent.",
                "Les retraits sont versés en moins de {hours} heures, sans justificatif.",
                "Jouez au blackjack, à la roulette et au poker avec de vrais croupiers, jour et nuit.",
                "Des milliers de joueurs gagnent déjà de l'argent depuis chez eux grâce à notre application.",
                "Les cotes sont boostées sur tous les matchs du week-end : impossible de perdre.",
                "Vos tours gratuits sont crédités dès que vous confirmez votre adresse e-mail.",
                "Pariez sur le football, le tennis et les courses hippiques avec les meilleures cotes de France.",
                "Chaque vendredi, nous offrons {spins} tours supplémentaires à nos membres fidèles.",
                "Ce n'est pas de la chance, c'est une méthode qui bat les bookmakers à chaque fois.",
            ),
            profane=(),
            close=(
                "Utilisez le code bonus {code} à l'inscription et réclamez votre récompense.",
                "Inscrivez-vous en {min} minutes et commencez à gagner dès aujourd'hui.",
                "Entrez le code {code} et doublez instantanément votre premier dépôt.",
                "Faites vite, cette offre expire dans {hours} heures.",
                "Réservé aux plus de 18 ans. Conditions applicables. Jouez maintenant et gagnez gros !",
            ),
        ),
    },
    "de": {
        "adult": _Pools(
            heads=(
                "Heiße Singles aus {city} wollen dich heute Abend treffen",
                "{count} neue Erotikvideos in dieser Woche, alle kostenlos",
                "{name} ({age}) wartet live vor ihrer Webcam auf dich",
                "Nur für Erwachsene: die frechsten Clips des Jahres {year} in HD",
                "Einsame Ehefrauen aus {city} suchen ein diskretes Abenteuer",
            ),
            body=(
                "Unsere Mitglieder laden jeden Tag {n} neue Clips hoch, alle völlig unzensiert.",
                "{name} aus {city} ist gerade online gegangen und fragt im privaten Chat nach dir.",
                "Keine Kreditkarte, keine Anmeldung, keine Grenzen: einfach klicken und zuschauen.",
                "Tausende freizügige Frauen sind genau jetzt online und wollen mit dir chatten.",
                "Keine Lust mehr auf langweilige Dates? Hier triffst du Frauen, die genau wissen, was sie wollen.",
                "Mehr als {count} heiße Videos, sortiert nach Kategorie, Länge und Bewertung.",
                "Jede Privatshow läuft in HD, und niemand wird je erfahren, dass du hier warst.",
                "Über {count} einsame Frauen aus deiner Gegend haben sich diesen Monat angemeldet.",
                "Unsere Webcam-Models antworten in weniger als {min} Minuten, Tag und Nacht.",
                "Vergiss Dating-Apps: Hier machen die Frauen den ersten Schritt.",
                "Clips, die du nirgendwo sonst findest, warten hinter diesem Link auf dich.",
                "Schalte deine Kamera ein, und {name} zeigt dir alles, was sie versprochen hat.",
                "Diese Seite enthält explizite Inhalte und ist nur für Personen ab 18 Jahren.",
                "Schließ dich den {count} Männern an, die unseren geheimen Club schon entdeckt haben.",
            ),
            profane=(
                "Geile Schlampen wollen heute Nacht mit Fremden ficken, live und ohne Tabus.",
                "{name} ist eine versaute Schlampe aus {city} und sucht einen Kerl zum Bumsen.",
                "Gratis Pornos, dicke Titten und Ficken ohne Pause, jede Stunde neu.",
                "Sieh dir an, wie versaute Luder in {n} neuen Pornos hart gefickt werden, jede Nutte ein Profi.",
                "Echte Amateurinnen zeigen ihre feuchte Muschi live vor der Kamera.",
            ),
            close=(
                "Klick hier und sei in weniger als {min} Minuten dabei.",
                "Melde dich heute kostenlos an und erhalte {n} Privatshows gratis.",
                "Betritt jetzt den Mitgliederbereich: Das Angebot endet um Mitternacht.",
                "Bestätige, dass du über 18 bist, und leg sofort los.",
                "Schreib {name} jetzt eine Nachricht, bevor es ein anderer tut.",
                "Beeil dich, heute gibt es nur noch {n} kostenlose Zugänge!",
            ),
        ),
        "hate": _Pools(
            heads=(
                "@{user} du bist echt der dümmste Mensch in diesem ganzen Forum.",
                "Antwort an {user}: Niemand will deinen Unsinn noch lesen.",
                "{user}, jeder deiner Kommentare macht diesen Thread noch schlimmer.",
                "Ach schau, {user} ist wieder da, mit der nächsten hirnlosen Meinung.",
            ),
            body=(
                "Leute wie du sollten nicht mal in die Nähe einer Tastatur dürfen.",
                "Du bist ein Parasit und reine Sauerstoffverschwendung, das weiß hier jeder.",
                "Kriech zurück unter den Stein, unter dem du hervorgekommen bist.",
                "Niemand hier respektiert dich, niemand mag dich, und das wird sich nie ändern.",
                "Du bist ein Stück Dreck, das sich für klug hält.",
                "Ich habe {n} deiner Beiträge gelesen, und jeder einzelne war wertlos.",
                "Deine Familie muss sich für den erbärmlichen Versager schämen, der aus dir geworden ist.",
                "Verschwinde und komm nie wieder, du nutzloser Trottel.",
                "Ungeziefer wie du macht jede Gemeinschaft kaputt.",
                "Du bist zu blöd, um auch nur ein Wort dieses Artikels zu verstehen.",
            ),
            profane=(
                "Halt einfach die Fresse, du Arschloch, keiner hat nach deiner Scheiße gefragt.",
                "Verpiss dich, du erbärmlicher Wichser.",
                "Du Hurensohn, tu der Welt einen Gefallen und lösch deinen Account.",
                "Was für ein Vollpfosten, ich fasse es nicht, dass es Leute wie dich gibt.",
                "Hau endlich ab, du Arsch, und nimm deinen Müll mit.",
            ),
            close=(
                "Poste weiter so, und du wirst es bereuen, das verspreche ich dir.",
                "Ich weiß, in welcher Stadt du wohnst, also pass gut auf dich auf.",
                "Sag das noch einmal, und ich sorge dafür, dass du dich hier nie wieder blicken lässt.",
                "Du bekommst, was du verdienst, {user}, und zwar schneller, als du denkst.",
                "Log dich aus, bevor dir jemand für immer das Maul stopft.",
            ),
        ),
        "gambling": _Pools(
            heads=(
                "Heute Abend groß gewinnen im {brand} Casino: {pct} % Bonus bis zu {bonus} €",
                "{spins} Freispiele warten auf dich, ganz ohne Einzahlung",
                "Garantierte Gewinne jeden Tag mit unserem neuen Wettsystem",
                "Jackpot-Alarm: {count} € in dieser Woche an Spieler ausgezahlt",
                "Der {brand} Willkommensbonus ist zurück, nur für {hours} Stunden",
            ),
            body=(
                "Neue Spieler erhalten {pct} % Bonus auf die erste Einzahlung, bis zu {bonus} €.",
                "Dreh an den Walzen von mehr als {games} Spielautomaten, ganz ohne Download.",
                "Letzte Woche hat {player} aus {city} mit einem Einsatz von 10 € auf einen Schlag {bigwin} € gewonnen.",
                "Unsere Experten verraten jeden Morgen todsichere Fußballtipps vor dem Anpfiff.",
                "Auszahlungen erfolgen in weniger als {hours} Stunden, ohne lästige Fragen.",
                "Spiel Blackjack, Roulette und Poker mit echten Dealern rund um die Uhr.",
                "Tausende Spieler verdienen mit unserer Wett-App schon jetzt Geld von zu Hause aus.",
                "Am Wochenende gibt es erhöhte Quoten auf jedes Spiel, du kannst also gar nicht verlieren.",
                "Deine Freispiele werden gutgeschrieben, sobald du deine E-Mail-Adresse bestätigst.",
                "Wette auf Fußball, Tennis und Pferderennen mit den besten Quoten im ganzen Land.",
                "Jeden Freitag verschenken wir {spins} zusätzliche Freispiele an treue Mitglieder.",
                "Das ist kein Glück, sondern ein System, das die Buchmacher jedes Mal schlägt.",
            ),
            profane=(),
            close=(
                "Gib bei der Anmeldung den Bonuscode {code} ein und hol dir deine Belohnung.",
                "Registriere dich in {min} Minuten und gewinne noch heute.",
                "Mit dem Code {code} verdoppelst du sofort deine erste Einzahlung.",
                "Schnell sein lohnt sich: Das Angebot läuft in {hours} Stunden ab.",
                "Ab 18. Es gelten die AGB. Jetzt spielen und groß gewinnen!",
            ),
        ),
    },
    "es": {
        "adult": _Pools(
            heads=(
                "Solteras ardientes de {city} quieren conocerte esta noche",
                "{count} vídeos para adultos nuevos esta semana, todos gratis",
                "{name}, {age} años, te espera en directo frente a su webcam",
                "Solo para adultos: los clips más atrevidos de {year} en HD",
                "Casadas aburridas de {city} buscan una aventura discreta",
            ),
            body=(
                "Nuestros miembros suben {n} clips nuevos cada día, todos sin censura.",
                "{name}, de {city}, acaba de conectarse y pregunta por ti en el chat privado.",
                "Sin tarjeta de crédito, sin registro y sin límites: haz clic y disfruta.",
                "Miles de chicas traviesas están conectadas ahora mismo y quieren hablar contigo.",
                "¿Cansado de citas aburridas? Aquí conocerás a mujeres que saben exactamente lo que quieren.",
                "Más de {count} vídeos picantes ordenados por categoría, duración y valoración.",
                "Todos los shows privados se emiten en HD y nadie sabrá nunca que estuviste aquí.",
                "Más de {count} mujeres solas de tu zona se han registrado este mes.",
                "Nuestras modelos de webcam responden en menos de {min} minutos, de día y de noche.",
                "Olvídate de las apps de citas: aquí son ellas las que dan el primer paso.",
                "Los vídeos que no encontrarás en ningún otro sitio te esperan detrás de este enlace.",
                "Enciende tu cámara y {name} te enseñará todo lo que te ha prometido.",
                "Contenido explícito solo para mayores de 18 años.",
                "Únete a los {count} hombres que ya han descubierto nuestro club secreto.",
            ),
            profane=(
                "Chicas calientes que quieren follar con desconocidos esta noche, en directo y sin tabúes.",
                "{name} es una puta de {city} que busca a alguien para follar hoy mismo.",
                "Porno gratis, tetas grandes y sexo duro sin parar, actualizado cada hora.",
                "Mira cómo se dejan follar en {n} vídeos porno nuevos.",
                "Aficionadas reales enseñando el coño en directo delante de la cámara.",
            ),
            close=(
                "Haz clic aquí para entrar, tardas menos de {min} minutos.",
                "Regístrate gratis hoy y llévate {n} shows privados de regalo.",
                "Entra ya en la zona de miembros: la oferta termina a medianoche.",
                "Confirma que eres mayor de 18 años y empieza a mirar ahora mismo.",
                "Escríbele a {name} antes de que lo haga otro.",
                "¡Date prisa, solo quedan {n} accesos gratuitos hoy!",
            ),
        ),
        "hate": _Pools(
            heads=(
                "@{user} eres la persona más tonta que he visto en todo este foro.",
                "Respuesta a {user}: nadie quiere seguir leyendo tus tonterías.",
                "{user}, cada comentario tuyo empeora todavía más este hilo.",
                "Mira, ya volvió {user} con otra opinión sin pies ni cabeza.",
            ),
            body=(
                "La gente como tú no debería ni acercarse a un teclado.",
                "Eres un parásito y un desperdicio de oxígeno, y aquí todos lo saben.",
                "Vuelve a esconderte debajo de la piedra de la que saliste.",
                "Aquí nadie te respeta, nadie te aprecia y eso nunca va a cambiar.",
                "Eres pura basura con pretensiones de opinar.",
                "He leído {n} de tus mensajes y ninguno valía absolutamente nada.",
                "Tu familia debe de estar avergonzada del fracasado patético en que te has convertido.",
                "Lárgate y no vuelvas nunca, payaso inútil.",
                "Las alimañas como tú arruinan cualquier comunidad que pisan.",
                "Eres demasiado estúpido para entender una sola palabra de este artículo.",
            ),
            profane=(
                "Cierra la boca, gilipollas, nadie te ha pedido tu opinión de mierda.",
                "Vete a la mierda, pedazo de imbécil.",
                "Eres un hijo de puta, hazle un favor al mundo y borra tu cuenta.",
                "Qué pendejo eres, no me creo que exista gente como tú.",
                "Lárgate de aquí, cabrón, y llévate tus estupideces contigo.",
            ),
            close=(
                "Sigue escribiendo y te vas a arrepentir, te lo prometo.",
                "Sé en qué ciudad vives, así que ten mucho cuidado.",
                "Repite eso y me aseguraré de que no vuelvas a asomar la cara por aquí.",
                "Vas a recibir lo que te mereces, {user}, antes de lo que crees.",
                "Desconéctate antes de que alguien te cierre la boca para siempre.",
            ),
        ),
        "gambling": _Pools(
            heads=(
                "Gana a lo grande esta noche en {brand} Casino: bono del {pct} % hasta {bonus} €",
                "{spins} giros gratis te están esperando, sin depósito",
                "Ganancias garantizadas cada día con nuestro nuevo sistema de apuestas",
                "Alerta de bote: {count} € pagados a los jugadores esta semana",
                "El bono de bienvenida de {brand} vuelve solo durante {hours} horas",
            ),
            body=(
                "Los jugadores nuevos reciben un {pct} % extra en su primer depósito, hasta {bonus} €.",
                "Haz girar los rodillos de más de {games} tragaperras sin descargar nada.",
                "La semana pasada, {player}, de {city}, convirtió una apuesta de 10 € en {bigwin} € de una tirada.",
                "Nuestros expertos comparten cada mañana pronósticos de fútbol que no fallan.",
                "Los retiros se pagan en menos de {hours} horas, sin preguntas.",
                "Juega al blackjack, a la ruleta y al póquer con crupieres en vivo a todas horas.",
                "Miles de jugadores ya ganan dinero desde casa con nuestra app de apuestas.",
                "Este fin de semana las cuotas están mejoradas en todos los partidos, así que no puedes perder.",
                "Tus giros gratis se acreditan en cuanto confirmas tu correo electrónico.",
                "Apuesta al fútbol, al tenis y a las carreras de caballos con las mejores cuotas del país.",
                "Cada viernes regalamos {spins} giros extra a nuestros miembros más fieles.",
                "No es suerte: es un sistema que vence a las casas de apuestas una y otra vez.",
            ),
            profane=(),
            close=(
                "Usa el código de bono {code} al registrarte y reclama tu premio ya.",
                "Regístrate en {min} minutos y empieza a ganar hoy mismo.",
                "Introduce el código {code} y duplica al instante tu primer depósito.",
                "Date prisa, esta oferta caduca en {hours} horas.",
                "Solo mayores de 18. Se aplican condiciones. ¡Juega ya y gana a lo grande!",
            ),
        ),
    },
}

_NAMES = {
    "en": ("Jessica", "Amber", "Kayla", "Brittany", "Megan", "Ashley", "Chloe", "Tiffany", "Heather", "Lauren"),
    "fr": ("Chloé", "Manon", "Camille", "Léa", "Sarah", "Julie", "Émilie", "Inès", "Océane", "Laura"),
    "de": ("Jana", "Lena", "Nicole", "Sandra", "Melanie", "Jessica", "Vanessa", "Sabrina", "Katja", "Anja"),
    "es": ("Lucía", "Marta", "Paula", "Carla", "Andrea", "Sara", "Alba", "Nerea", "Elena", "Raquel"),
}
_PLAYERS = {
    "en": ("Mike", "Dave", "Chris", "Steve", "Tom", "Ryan", "Jason", "Mark"),
    "fr": ("Julien", "Kevin", "Thomas", "Nicolas", "Mehdi", "Romain", "Sébastien", "Maxime"),
    "de": ("Jonas", "Tobias", "Sven", "Marco", "Dennis", "Stefan", "Kevin", "Patrick"),
    "es": ("Javier", "Sergio", "Álvaro", "Rubén", "Pablo", "Iván", "Diego", "Adrián"),
}
_CITIES = {
    "en": ("Chicago", "Houston", "Leeds", "Manchester", "Phoenix", "Denver", "Bristol", "Seattle", "Dallas"),
    "fr": ("Lyon", "Marseille", "Toulouse", "Lille", "Nantes", "Bordeaux", "Strasbourg", "Montpellier", "Rennes"),
    "de": ("Berlin", "Hamburg", "München", "Köln", "Leipzig", "Dresden", "Stuttgart", "Bremen", "Hannover"),
    "es": ("Madrid", "Sevilla", "Valencia", "Málaga", "Bilbao", "Zaragoza", "Granada", "Murcia", "Alicante"),
}
_THOUSANDS = {"en": ",", "fr": " ", "de": ".", "es": "."}
_BRANDS = ("Lucky Crown", "Golden Ace", "Royal Falcon", "Diamond Reef", "Silver Lynx", "Red Comet", "Jade Palace")
_HANDLES = ("nightowl", "grey_fox", "redkite", "pixelpete", "truthseeker", "coffeeguy", "nordlicht", "el_gato")
_CODE_WORDS = ("WIN", "GOLD", "SPIN", "LUCKY", "BONUS", "VIP", "JACKPOT", "ROYAL")
# Host and path words for every URL: none is, or joins another into, a word of kiln's URL lists.
_URL_WORDS = (
    "sunny", "velvet", "midnight", "amber", "silver", "cherry", "honey", "maple", "coral", "breeze", "willow",
    "orchid", "comet", "harbor", "meadow", "pixel", "lotus", "cobalt", "river", "summit",
)  # fmt: skip

# Each adult URL holds a word or subword of kiln's shipped URL lists (or two soft words), so the URL filter
# with its default lists removes it.
_ADULT_URLS = (
    "https://www.hot-{w}.example/free-porn-videos/{id}",
    "https://{w}xxx.example/live-sexcams/{id}",
    "https://nsfw-{w}.example/videos/{id}",
    "https://{w}.example/nude-webcams/{id}",
    "https://www.{w}-milfs.example/gallery/{id}",
    "https://{w}camgirls.example/live/{id}",
)
_ADULT_URLS_OF = {
    "en": "https://{w}-porntube.example/watch/{id}",
    "fr": "https://porno-gratuit-{w}.example/videos/{id}",
    "de": "https://{w}-ficken.example/clips/{id}",
    "es": "https://videos-porno-{w}.example/{id}",
}
_NEUTRAL_URLS = (
    "https://{w}-{n}.example/page/{id}",
    "https://www.{w}{w2}.example/{id}/index.html",
    "https://{w}-{w2}.example/p/{id}?ref={m}",
    "https://{w}{n}.example/go/{id}",
)
_FORUM_URLS = (
    "https://forum-{w}.example/thread/{id}#comment-{m}",
    "https://news-{w}.example/{year}/{id}/comments#c{m}",
    "https://{w}-board.example/t/{id}/{m}",
)
_FORUM_URLS_OF = {
    "en": "https://{w}-talk.example/topic/{id}#post-{m}",
    "fr": "https://forum-{w}.example/sujet/{id}#commentaire-{m}",
    "de": "https://{w}-forum.example/thema/{id}#beitrag-{m}",
    "es": "https://foro-{w}.example/tema/{id}#comentario-{m}",
}
_CASINO_URLS = (
    "https://{w}-casino-{n}.example/bonus",
    "https://bet{w}.example/promo",
    "https://{w}-slots.example/free-spins/{id}",
    "https://www.{w}bet{n}.example/sign-up?code={code}",
)
_CASINO_URLS_OF = {
    "en": "https://{w}-sportsbook.example/offer/{id}",
    "fr": "https://casino-{w}.example/bonus-sans-depot",
    "de": "https://{w}-wetten.example/bonus/{id}",
    "es": "https://apuestas-{w}.example/promo/{id}",
}
_DOC_SLUGS = ("guide", "manual", "reference", "install", "overview", "faq", "changelog", "tutorial", "notes")

# Word counts (whitespace-separated) each document keeps within.
_WORDS = {"adult": (80, 250), "hate": (60, 200), "gambling": (80, 250)}
_BODY = {"adult": (4, 8), "hate": (3, 6), "gambling": (4, 8)}
_CLOSE = {"adult": (1, 2), "hate": (1, 1), "gambling": (1, 2)}
_FORMATTER = string.Formatter()


def planted(seed: int, per_kind: int) -> list[dict[str, str]]:
    """`per_kind` documents of each kind in each language: records with id, text, url, language and kind."""
    rng = random.Random(seed)
    records = []
    seen: set[str] = set()
    for language in LANGUAGES:
        for kind in KINDS:
            for i in range(per_kind):
                fixed = _fixed(rng, language)
                text = _text(rng, language, kind, kind != "gambling" and i % 2 == 0, fixed)
                while text in seen:
                    fixed = _fixed(rng, language)
                    text = _text(rng, language, kind, kind != "gambling" and i % 2 == 0, fixed)
                seen.add(text)
                records.append(
                    {
                        "id": f"{kind}-{language}-{seed}-{i}",
                        "text": text,
                        "url": _fill(rng, rng.choice(_urls(language, kind, i)), fixed, language),
                        "language": language,
                        "kind": kind,
                    }
                )
    return records


def clean_pages(texts: list[str], seed: int) -> list[dict[str, str]]:
    """The caller's clean texts as records like planted()'s, kind "clean", each with a neutral URL."""
    rng = random.Random(seed)
    return [
        {
            "id": f"clean-{seed}-{i}",
            "text": text,
            "url": f"https://docs-{rng.randrange(100, 10000)}.example/{rng.choice(_DOC_SLUGS)}-{i}",
            "language": "en",
            "kind": "clean",
        }
        for i, text in enumerate(texts)
    ]


def labelled(seed: int, per_kind: int, clean_texts: list[str]) -> list[dict[str, str]]:
    """Training rows {text, label}: planted(seed, per_kind) as "unsafe", clean_texts as "safe", shuffled."""
    rows = [{"text": record["text"], "label": "unsafe"} for record in planted(seed, per_kind)]
    rows += [{"text": text, "label": "safe"} for text in clean_texts]
    random.Random(seed).shuffle(rows)
    return rows


def write_jsonl(path: str | Path, records: Iterable[dict[str, str]]) -> Path:
    """Write one JSON object a line (UTF-8, non-ASCII kept as is); returns the path."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def write_csv(path: str | Path, rows: list[dict[str, str]]) -> Path:
    """Write rows as CSV with a header from the first row's keys (an empty file for no rows); returns the path."""
    path = Path(path)
    with path.open("w", encoding="utf-8", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


def _fixed(rng: random.Random, language: str) -> dict[str, str]:
    """The values a document keeps in every sentence and its URL (one name, one user, one bonus code)."""
    w, w2 = rng.sample(_URL_WORDS, 2)
    return {
        "name": rng.choice(_NAMES[language]),
        "player": rng.choice(_PLAYERS[language]),
        "city": rng.choice(_CITIES[language]),
        "brand": rng.choice(_BRANDS),
        "user": f"{rng.choice(_HANDLES)}{rng.randint(1, 999)}",
        "code": f"{rng.choice(_CODE_WORDS)}{rng.randint(10, 999)}",
        "year": str(rng.randint(2019, 2025)),
        "w": w,
        "w2": w2,
    }


def _number(rng: random.Random, slot: str, language: str) -> str:
    """A fresh value for a numeric slot, grouped in thousands as the language writes them."""
    grouped = {"count": (1200, 99000), "games": (300, 3000), "bigwin": (1500, 250000)}
    if slot in grouped:
        return f"{rng.randint(*grouped[slot]):,}".replace(",", _THOUSANDS[language])
    draws = {
        "n": lambda: rng.randint(3, 60),
        "m": lambda: rng.randint(1, 999),
        "id": lambda: rng.randint(1000, 99999),
        "age": lambda: rng.randint(21, 45),
        "min": lambda: rng.randint(2, 15),
        "pct": lambda: rng.choice((100, 150, 200, 250, 300, 400, 500)),
        "bonus": lambda: rng.randrange(100, 2001, 50),
        "spins": lambda: rng.randrange(20, 301, 10),
        "hours": lambda: rng.choice((12, 24, 48, 72)),
    }
    return str(draws[slot]())


def _fill(rng: random.Random, template: str, fixed: dict[str, str], language: str) -> str:
    values: dict[str, str] = {}
    for _, slot, _, _ in _FORMATTER.parse(template):
        if slot and slot not in values:
            values[slot] = fixed[slot] if slot in fixed else _number(rng, slot, language)
    return template.format(**values)


def _urls(language: str, kind: str, i: int) -> tuple[str, ...]:
    if kind == "adult":
        return (*_ADULT_URLS, _ADULT_URLS_OF[language]) if i % 4 < 2 else _NEUTRAL_URLS
    if kind == "hate":
        return (*_FORUM_URLS, _FORUM_URLS_OF[language])
    return (*_CASINO_URLS, _CASINO_URLS_OF[language])


def _split(rng: random.Random, items: list[str], parts: int) -> list[list[str]]:
    """`items` in order, cut into `parts` non-empty runs at random places."""
    cuts = sorted(rng.sample(range(1, len(items)), parts - 1))
    return [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)])]


def _text(rng: random.Random, language: str, kind: str, profane: bool, fixed: dict[str, str]) -> str:
    pools = _TEXTS[language][kind]
    low, high = _WORDS[kind]
    order = rng.sample(pools.body, len(pools.body))
    take = rng.randint(*_BODY[kind])
    body = [_fill(rng, t, fixed, language) for t in order[:take]]
    spare = order[take:]
    swearing = [_fill(rng, t, fixed, language) for t in rng.sample(pools.profane, rng.randint(1, 2))] if profane else []
    for sentence in swearing:
        body.insert(rng.randint(0, len(body)), sentence)
    head = _fill(rng, rng.choice(pools.heads), fixed, language)
    close = [_fill(rng, t, fixed, language) for t in rng.sample(pools.close, rng.randint(*_CLOSE[kind]))]

    def words() -> int:
        return sum(len(s.split()) for s in (head, *body, *close))

    while words() < low and spare:
        body.insert(rng.randint(0, len(body)), _fill(rng, spare.pop(), fixed, language))
    while words() > high:
        body.remove(rng.choice([s for s in body if s not in swearing]))
    if kind == "hate":
        parts = _split(rng, body, rng.randint(2, min(4, len(body))))
        parts[0].insert(0, head)
        parts[-1].extend(close)
        return "\n\n".join(" ".join(part) for part in parts)
    parts = _split(rng, body, rng.randint(2, min(3, len(body))))
    return "\n\n".join([head, *(" ".join(part) for part in parts), " ".join(close)])

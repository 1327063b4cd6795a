//! The prompts a drafter is self-distilled on: chat requests the project writes from topic
//! and task lists (explanations, lists, comparisons, how-tos, stories, poems, emails, code,
//! SQL, shell, translation, arithmetic word problems), deterministic for a seed.
//!
//! A user's own prompts can replace the lists (`prompts_from_file`).
//!
//! Held-out prompts draw from topics the training prompts never use, so acceptance measured
//! on them is acceptance on requests the drafter has not seen.

use std::path::Path;

/// Topics training prompts are written about.
const TOPICS: &[&str] = &[
    "photosynthesis",
    "black holes",
    "the water cycle",
    "volcanoes",
    "the French Revolution",
    "ancient Rome",
    "the printing press",
    "electric cars",
    "solar panels",
    "wind turbines",
    "recycling",
    "climate change",
    "the human heart",
    "the immune system",
    "vaccines",
    "sleep",
    "nutrition",
    "exercise",
    "meditation",
    "coffee",
    "tea",
    "chocolate",
    "bread baking",
    "pizza",
    "sushi",
    "gardening",
    "houseplants",
    "bees",
    "dolphins",
    "elephants",
    "penguins",
    "wolves",
    "cats",
    "dogs",
    "horses",
    "dinosaurs",
    "fossils",
    "earthquakes",
    "hurricanes",
    "tornadoes",
    "rainbows",
    "the moon",
    "Mars",
    "Jupiter",
    "the Sun",
    "comets",
    "satellites",
    "the internet",
    "email",
    "smartphones",
    "social media",
    "video games",
    "chess",
    "soccer",
    "basketball",
    "tennis",
    "the Olympics",
    "marathons",
    "cycling",
    "swimming",
    "the piano",
    "the guitar",
    "jazz",
    "classical music",
    "opera",
    "painting",
    "sculpture",
    "photography",
    "movies",
    "theater",
    "poetry",
    "libraries",
    "museums",
    "newspapers",
    "democracy",
    "taxes",
    "inflation",
    "banks",
    "credit cards",
    "budgeting",
    "saving money",
    "investing",
    "the stock market",
    "startups",
    "remote work",
    "job interviews",
    "public speaking",
    "time management",
    "learning a language",
    "reading habits",
    "writing essays",
    "note taking",
    "online courses",
    "teachers",
    "homework",
    "friendship",
    "kindness",
    "teamwork",
    "leadership",
    "negotiation",
    "conflict resolution",
    "travel",
    "packing a suitcase",
    "camping",
    "hiking",
    "mountains",
    "deserts",
    "rainforests",
    "oceans",
    "rivers",
    "islands",
    "trains",
    "airplanes",
    "bicycles",
    "bridges",
    "skyscrapers",
    "castles",
    "pyramids",
    "the Great Wall of China",
    "the Roman Empire",
    "the Industrial Revolution",
    "the Renaissance",
    "electricity",
    "magnets",
    "gravity",
    "light",
    "sound",
    "atoms",
    "DNA",
    "evolution",
    "cells",
    "bacteria",
    "viruses",
    "antibiotics",
    "first aid",
    "recipes",
    "cooking pasta",
    "baking cookies",
    "weather forecasts",
    "clouds",
    "snow",
    "seasons",
    "calendars",
    "clocks",
    "maps",
    "compasses",
    "robots",
    "artificial intelligence",
    "computers",
    "programming",
    "databases",
    "cybersecurity",
    "passwords",
    "encryption",
    "cloud computing",
    "3D printing",
    "drones",
    "batteries",
    "nuclear energy",
    "the Amazon river",
    "the Sahara",
    "Antarctica",
    "the Arctic",
    "the Alps",
    "the Himalayas",
    "Mount Everest",
    "the Nile",
    "Venice",
    "Paris",
    "Tokyo",
    "New York City",
    "London",
    "Rome",
    "Egypt",
    "India",
    "Brazil",
    "Canada",
    "Australia",
    "Japan",
    "Mexico",
    "Greece",
    "Vikings",
    "samurai",
    "knights",
    "pirates",
    "the Silk Road",
    "the Moon landing",
    "the space race",
    "the International Space Station",
    "telescopes",
    "microscopes",
    "thermometers",
    "the periodic table",
    "chemical reactions",
    "acids and bases",
    "water",
    "oxygen",
    "carbon",
    "gold",
    "iron",
    "plastic",
    "glass",
    "paper",
    "cotton",
    "wool",
    "rubber",
    "concrete",
    "steel",
    "wood",
    "rain",
    "thunderstorms",
    "lightning",
    "fog",
    "wind",
    "air pollution",
    "deforestation",
    "endangered species",
    "national parks",
    "zoos",
    "aquariums",
    "sharks",
    "whales",
    "octopuses",
    "jellyfish",
    "butterflies",
    "ants",
    "spiders",
    "frogs",
    "snakes",
    "turtles",
    "eagles",
    "parrots",
    "crows",
    "chickens",
    "cows",
    "sheep",
    "goats",
    "rabbits",
    "hamsters",
    "goldfish",
    "tigers",
    "lions",
    "giraffes",
    "pandas",
    "kangaroos",
    "koalas",
    "bats",
    "mushrooms",
    "trees",
    "flowers",
    "cactuses",
    "seeds",
    "soil",
    "composting",
    "farming",
    "tractors",
    "irrigation",
    "rice",
    "wheat",
    "potatoes",
    "tomatoes",
    "apples",
    "bananas",
    "oranges",
    "strawberries",
    "honey",
    "milk",
    "eggs",
    "soup",
    "salad",
    "sandwiches",
    "breakfast",
    "vegetarian diets",
    "spices",
    "kitchen safety",
    "grocery shopping",
    "cleaning the house",
    "laundry",
    "moving to a new city",
    "renting an apartment",
    "buying a car",
    "driving lessons",
    "traffic",
    "public transport",
    "electric scooters",
    "road trips",
    "airports",
    "hotels",
    "museums of art",
    "board games",
    "puzzles",
    "card games",
    "magic tricks",
    "dancing",
    "singing",
    "drums",
    "rock music",
    "hip hop",
    "film making",
    "animation",
    "comic books",
    "novels",
    "fairy tales",
    "myths",
    "superheroes",
    "birthdays",
    "weddings",
    "holidays",
    "New Year celebrations",
    "gifts",
    "family dinners",
    "grandparents",
    "babies",
    "teenagers",
    "pets",
    "volunteering",
    "charity",
    "recycling at home",
    "saving energy",
    "water conservation",
    "electric grids",
    "hydropower",
    "geothermal energy",
    "hydrogen fuel",
    "rockets",
    "jet engines",
    "cars",
    "motorcycles",
    "ships",
    "canals",
    "tunnels",
    "roads",
    "cities",
    "villages",
    "architecture",
    "interior design",
    "furniture",
    "fashion",
    "shoes",
    "sunglasses",
    "watches",
    "perfume",
    "hair care",
    "skin care",
    "dentists",
    "doctors",
    "nurses",
    "hospitals",
    "pharmacies",
    "allergies",
    "colds and flu",
    "headaches",
    "stress",
    "happiness",
    "motivation",
    "habits",
    "goal setting",
    "procrastination",
    "focus",
    "memory",
    "curiosity",
    "creativity",
    "critical thinking",
    "logic puzzles",
    "mathematics",
    "fractions",
    "percentages",
    "geometry",
    "algebra",
    "statistics",
    "probability",
    "prime numbers",
    "infinity",
    "money",
    "bartering",
    "shopping online",
    "advertising",
    "marketing",
    "customer service",
    "small businesses",
    "entrepreneurs",
    "resumes",
    "salaries",
    "retirement",
    "insurance",
    "contracts",
    "laws",
    "courts",
    "elections",
    "voting",
    "the United Nations",
    "human rights",
    "maps and navigation",
    "GPS",
    "the telephone",
    "radio",
    "television",
    "cameras",
    "printers",
    "keyboards",
    "operating systems",
    "web browsers",
    "search engines",
    "open source software",
    "spreadsheets",
    "version control",
    "software testing",
    "algorithms",
    "sorting algorithms",
    "machine learning",
    "chatbots",
    "virtual reality",
    "video calls",
    "online privacy",
    "spam email",
    "backups",
    "Wi-Fi",
    "Bluetooth",
    "electric motors",
    "solar system",
    "stars",
    "galaxies",
    "the Big Bang",
    "eclipses",
    "meteors",
    "astronauts",
    "aliens",
    "time zones",
    "leap years",
];

/// Topics only held-out prompts use.
const HELD_OUT_TOPICS: &[&str] = &[
    "lighthouses",
    "glaciers",
    "origami",
    "beekeeping",
    "submarines",
    "hot air balloons",
    "tides",
    "coral reefs",
    "the metric system",
    "kites",
    "volleyball",
    "the violin",
    "knitting",
    "sundials",
    "owls",
    "cheese making",
    "zeppelins",
    "fireflies",
];

/// Held-out prompts use the first this many task phrasings (the set the shipped draft was first
/// measured on), so adding phrasings below does not change the held-out prompts.
const HELD_OUT_TASKS: usize = 15;

/// Task phrasings with `{}` for the topic.
const TASKS: &[&str] = &[
    "Explain {} in simple terms.",
    "What are three interesting facts about {}?",
    "Write a short paragraph about {}.",
    "Give me a list of five tips related to {}.",
    "Describe the history of {} briefly.",
    "What are the pros and cons of {}?",
    "Write a short poem about {}.",
    "Explain {} to a ten-year-old.",
    "Write the opening of a short story involving {}.",
    "Summarize the most important things to know about {} in two sentences.",
    "Write a friendly email to a colleague about {}.",
    "How does {} affect everyday life?",
    "Compare {} with something similar and explain the differences.",
    "What questions do people often ask about {}? Answer two of them.",
    "Why is {} important?",
    "Write a haiku about {}.",
    "Give me a step-by-step guide to learning about {}.",
    "What is a common misconception about {}?",
    "Write a short dialogue between two friends talking about {}.",
    "List three advantages and three disadvantages of {}.",
    "Explain how {} works.",
    "Write a product description inspired by {}.",
    "Create a short quiz with three questions about {}.",
    "Tell me a fun fact about {} and explain why it is true.",
    "Write a tweet about {}.",
    "How would you explain {} to someone from the year 1800?",
];

/// Programming tasks.
const CODE_TASKS: &[&str] = &[
    "Write a Python function that reverses a string.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that checks whether a word is a palindrome.",
    "Write a Python function that computes the n-th Fibonacci number.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that finds the largest number in a list.",
    "Write a Python function that removes duplicates from a list.",
    "Write a Python function that sorts a list of dictionaries by a key.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a Python function that reads a text file and counts its lines.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python function that checks whether a year is a leap year.",
    "Write a Python function that returns the sum of the digits of a number.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that computes the average of a list of numbers.",
    "Write a JavaScript function that capitalizes the first letter of every word.",
    "Write a JavaScript function that returns the maximum of an array.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that selects all customers from a table named customers where the city is Paris.",
    "Write a SQL query that returns the ten most expensive products from a products table.",
    "Write a SQL query that counts orders per customer in an orders table.",
    "Write a SQL query that joins employees and departments on department_id.",
    "Write a bash command that counts the files in the current directory.",
    "Write a bash script that prints the numbers from 1 to 10.",
    "Write a Rust function that returns the length of the longest word in a string.",
    "Write a C function that swaps two integers using pointers.",
    "Explain what a for loop is in Python with an example.",
    "Explain the difference between a list and a tuple in Python.",
    "Explain what recursion is with a small Python example.",
    "Write a Python function that checks whether two strings are anagrams.",
    "Write a Python function that returns the prime numbers below n.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a Python function that computes the greatest common divisor of two numbers.",
    "Write a Python script that prints a multiplication table from 1 to 9.",
    "Write a Python function that returns the second largest number in a list.",
    "Write a Python function that counts how often each word appears in a sentence.",
    "Write a Python function that checks whether a list is sorted.",
    "Write a Python function that converts a binary string to an integer.",
    "Write a Python function that returns the common elements of two lists.",
    "Write a Python function that capitalizes every word in a sentence.",
    "Write a Python function that computes the median of a list.",
    "Write a Python function that returns the n-th row of Pascal's triangle.",
    "Write a Python function that rotates a list by k positions.",
    "Write a Python function that finds the index of a value with binary search.",
    "Write a Python function that implements bubble sort.",
    "Write a Python function that reads a CSV file and returns its rows.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python class for a to-do list.",
    "Write a Python function that checks whether parentheses in a string are balanced.",
    "Write a Python function that returns the longest common prefix of a list of strings.",
    "Write a JavaScript function that checks whether a string is a palindrome.",
    "Write a JavaScript function that sums the numbers in an array.",
    "Write a JavaScript function that fetches JSON from a URL.",
    "Write an HTML page with a title and a button.",
    "Write a CSS rule that centers a div.",
    "Write a SQL query that finds the average salary per department.",
    "Write a SQL query that deletes rows older than 30 days from a logs table.",
    "Write a SQL query that creates a table for books with a title, an author and a year.",
    "Write a bash script that backs up a directory into a tar file.",
    "Write a bash command that finds all .txt files in a directory.",
    "Write a Rust function that reverses a vector.",
    "Write a Java method that returns the maximum of three integers.",
    "Write a C++ function that computes the factorial of n.",
    "Write a Go function that adds two numbers.",
    "Explain what a dictionary is in Python with an example.",
    "Explain what an API is with an example.",
    "Explain the difference between == and is in Python.",
    "Explain what a class is in object-oriented programming.",
    "Explain what Git is and how to make a commit.",
];

const PHRASES: &[&str] = &[
    "good night",
    "where is the train station?",
    "thank you very much",
    "I would like a coffee",
    "how much does this cost?",
    "the weather is nice today",
    "I am learning to cook",
    "see you tomorrow",
    "can you help me?",
    "I love reading books",
    "what time is it?",
    "happy birthday",
    "I am hungry",
    "where is the bathroom?",
    "my name is Anna",
    "the book is on the table",
    "I don't understand",
    "please speak more slowly",
    "I live in a small town",
    "the museum opens at nine",
    "we are going to the beach",
];

const LANGUAGES: &[&str] = &["Spanish", "French", "German", "Italian", "Portuguese"];

const NAMES: &[&str] = &["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro"];
const ITEMS: &[&str] = &["apples", "books", "pencils", "marbles", "stickers", "cookies"];

/// A deterministic generator of xorshift numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

fn word_problem(rng: &mut Rng) -> String {
    let (a, b) = (rng.pick(NAMES), rng.pick(NAMES));
    let item = rng.pick(ITEMS);
    let (x, y) = (3 + rng.next() % 20, 2 + rng.next() % 15);
    format!("{a} has {x} {item} and {b} gives {a} {y} more. How many {item} does {a} have now? Explain your answer.")
}

/// `count` training prompts for `seed`: every (topic, task) pair and the code, translation
/// and arithmetic prompts, shuffled, cycling with variations if more are asked for.
pub fn training_prompts(count: usize, seed: u64) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for topic in TOPICS {
        for task in TASKS {
            all.push(task.replace("{}", topic));
        }
    }
    all.extend(CODE_TASKS.iter().map(|s| s.to_string()));
    for phrase in PHRASES {
        for lang in LANGUAGES {
            all.push(format!("Translate '{phrase}' into {lang}."));
        }
    }
    let mut rng = Rng(seed | 1);
    for _ in 0..200 {
        all.push(word_problem(&mut rng));
    }
    // Fisher-Yates with the seeded generator.
    for i in (1..all.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        all.swap(i, j);
    }
    let mut out = Vec::with_capacity(count);
    let mut round = 0;
    while out.len() < count {
        for p in &all {
            if out.len() == count {
                break;
            }
            out.push(if round == 0 { p.clone() } else { format!("{p} Keep it short.") });
        }
        round += 1;
    }
    out
}

/// Prompts `skip..skip + count` of the list [`training_prompts`] shuffles with `seed`: a round
/// that continues a draft passes over the prompts earlier rounds answered.
pub fn training_prompts_from(skip: usize, count: usize, seed: u64) -> Vec<String> {
    let mut prompts = training_prompts(skip.saturating_add(count), seed);
    prompts.split_off(skip.min(prompts.len()))
}

/// User requests read from a file of the user's own prompts (`train-draft --prompts`): a JSON
/// array of strings, or JSON Lines of strings or of objects with a `"prompt"` string. Blank
/// lines are skipped; the error names the line and what it should hold.
pub fn prompts_from_file(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--prompts {}: {e}", path.display()))?;
    let bad = |what: String| format!("--prompts {}: {what}", path.display());
    let prompts: Vec<String> = if text.trim_start().starts_with('[') {
        serde_json::from_str(&text).map_err(|e| bad(format!("expected a JSON array of strings: {e}")))?
    } else {
        text.lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::String(p)) => Ok(p),
                Ok(serde_json::Value::Object(o)) if o.get("prompt").is_some_and(|p| p.is_string()) => {
                    Ok(o["prompt"].as_str().expect("checked").to_string())
                }
                _ => Err(bad(format!(
                    "line {}: expected a JSON string or an object with a \"prompt\" string (JSON Lines), \
                     or make the whole file one JSON array of strings",
                    i + 1
                ))),
            })
            .collect::<Result<_, _>>()?
    };
    if let Some(i) = prompts.iter().position(|p| p.trim().is_empty()) {
        return Err(bad(format!("prompt {} is empty", i + 1)));
    }
    Ok(prompts)
}

/// Prompts about topics no training prompt uses, plus the reference prompts of the default
/// model's fidelity table (also absent from training).
pub fn held_out_prompts() -> Vec<String> {
    let mut out = vec![
        "Write a Python function that checks whether a number is prime.".to_string(),
        "Explain what a hash table is to a ten-year-old.".to_string(),
        "Translate 'good morning, how are you?' into Spanish.".to_string(),
        "Summarize the plot of Romeo and Juliet in two sentences.".to_string(),
        "Give me a SQL query that counts rows in a table named users.".to_string(),
        "Write a short story opening about a robot who learns to paint.".to_string(),
    ];
    for (i, topic) in HELD_OUT_TOPICS.iter().enumerate() {
        out.push(TASKS[i % HELD_OUT_TASKS].replace("{}", topic));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_round_takes_the_prompts_after_the_ones_skipped() {
        let first_rounds = training_prompts(500, 7);
        let next = training_prompts_from(300, 200, 7);
        assert_eq!(next, first_rounds[300..]);
        assert_eq!(training_prompts_from(0, 300, 7), first_rounds[..300]);
    }

    #[test]
    fn prompts_are_deterministic_and_distinct() {
        let a = training_prompts(500, 7);
        assert_eq!(a, training_prompts(500, 7));
        assert_ne!(a, training_prompts(500, 8));
        let unique: std::collections::HashSet<&String> = a.iter().collect();
        assert_eq!(unique.len(), 500);
    }

    #[test]
    fn the_lists_give_ten_thousand_distinct_prompts_before_any_repeats_shortened() {
        let prompts = training_prompts(10_000, 7);
        assert!(prompts.iter().all(|p| !p.ends_with("Keep it short.")));
        let unique: std::collections::HashSet<&String> = prompts.iter().collect();
        assert_eq!(unique.len(), 10_000);
    }

    #[test]
    fn held_out_prompts_keep_the_first_task_phrasings() {
        let held = held_out_prompts();
        assert_eq!(held.len(), 6 + HELD_OUT_TOPICS.len());
        // The 16th topic wraps around to the first phrasing, as with the original 15.
        assert_eq!(held[6 + 15], format!("Explain {} in simple terms.", HELD_OUT_TOPICS[15]));
    }

    #[test]
    fn held_out_prompts_never_appear_in_training() {
        let train: std::collections::HashSet<String> = training_prompts(20_000, 1).into_iter().collect();
        for p in held_out_prompts() {
            assert!(!train.contains(&p), "{p}");
            for topic in HELD_OUT_TOPICS {
                assert!(!TOPICS.contains(topic));
            }
        }
    }

    fn written(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn prompt_files_read_as_a_json_array_or_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let array = written(&dir, "a.json", r#"["Plan a picnic.", "Why is the sky blue?"]"#);
        assert_eq!(prompts_from_file(&array).unwrap(), ["Plan a picnic.", "Why is the sky blue?"]);
        let lines =
            written(&dir, "b.jsonl", "\"Plan a picnic.\"\n\n{\"prompt\": \"Why is the sky blue?\", \"id\": 3}\n");
        assert_eq!(prompts_from_file(&lines).unwrap(), ["Plan a picnic.", "Why is the sky blue?"]);
    }

    #[test]
    fn bad_prompt_files_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("specrs-no-such-prompts.json");
        assert!(prompts_from_file(&missing).unwrap_err().contains("specrs-no-such-prompts.json"));
        let err =
            prompts_from_file(&written(&dir, "c.jsonl", "\"fine\"\n{\"text\": \"no prompt key\"}\n")).unwrap_err();
        assert!(err.contains("line 2") && err.contains("\"prompt\""), "{err}");
        let err = prompts_from_file(&written(&dir, "d.json", "[1, 2]")).unwrap_err();
        assert!(err.contains("JSON array of strings"), "{err}");
        let err = prompts_from_file(&written(&dir, "e.json", r#"["ok", "  "]"#)).unwrap_err();
        assert!(err.contains("prompt 2 is empty"), "{err}");
    }
}

//! Prefix reuse across re-tokenization ([`ds4_model::chat::Seams`]) on the
//! real SmolLM2 tokenizer: a prompt that sends back text the model
//! sampled as tokens a tokenizer would not choose starts with those
//! tokens; the prompt's bytes never change.
//!
//! The model is found through `DS4_TEST_MODEL` or as `ds4.gguf` in a parent
//! folder of this crate; run `./scripts/fetch-model.sh` to get it.

mod common;
use common::smollm2_tokenizer as tokenizer;

use ds4_model::chat::Seams;

fn id(s: &str) -> u32 {
    tokenizer()
        .token_id(s)
        .unwrap_or_else(|| panic!("{s:?} is not a SmolLM2 token"))
}

const TURN: &str = "<|im_start|>user\nSay hello<|im_end|>\n<|im_start|>assistant\n";
const NEXT: &str = "<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n";

/// The first turn's prompt, then "Hello there" sampled as "Hel" "lo"
/// "Ġthere" (the tokenizer writes "Hello" as one token).
fn sampled() -> Vec<u32> {
    let tok = tokenizer();
    let mut seq = tok.encode(TURN, true).unwrap();
    seq.extend([id("Hel"), id("lo"), id("Ġthere")]);
    seq
}

#[test]
fn a_sent_back_answer_keeps_its_sampled_tokens() {
    let tok = tokenizer();
    let seq = sampled();
    assert_ne!(
        tok.encode("Hello there", true).unwrap(),
        seq[seq.len() - 3..],
        "the sampled tokens must differ from the tokenizer's"
    );
    let seams = Seams::new();
    seams.remember(&seq);

    let text = format!("{TURN}Hello there{NEXT}");
    let own = tok.encode(&text, true).unwrap();
    let tokens = seams.encode(tok, &text, true).unwrap();
    assert!(tokens.starts_with(&seq), "{tokens:?}");
    assert_eq!(&tokens[seq.len()..], &tok.encode(NEXT, true).unwrap()[..]);
    assert_eq!(tok.decode(&tokens), text);
    // Without the memory, the text's own tokens part from the sampled
    // ones at "Hello".
    let shared = own.iter().zip(&seq).take_while(|(a, b)| a == b).count();
    assert_eq!(shared, seq.len() - 3);
}

#[test]
fn unrelated_and_canonical_prompts_keep_their_own_tokens() {
    let tok = tokenizer();
    let seams = Seams::new();
    seams.remember(&sampled());
    for text in [
        "A different conversation altogether.".to_string(),
        // Shares the first turn, then says something else: the sampled
        // tokens cover nothing the text's own tokens do not.
        format!("{TURN}Goodbye{NEXT}"),
        // Empty.
        String::new(),
    ] {
        assert_eq!(
            seams.encode(tok, &text, true).unwrap(),
            tok.encode(&text, true).unwrap(),
            "{text:?}"
        );
    }
}

#[test]
fn the_seam_never_splits_a_character() {
    let tok = tokenizer();
    let seams = Seams::new();
    // "é" is two bytes; the sampled sequence ends inside the text's "é"
    // when the text goes on with "è" instead: the common bytes end
    // mid-character, and the seam moves back to a character boundary.
    let mut seq = tok.encode(TURN, true).unwrap();
    let cafe = tok.encode("Hello café", true).unwrap();
    seq.extend(&cafe);
    seams.remember(&seq);
    for tail in ["Hello cafè au lait", "Hello café au lait", "Hello caf"] {
        let text = format!("{TURN}{tail}");
        let tokens = seams.encode(tok, &text, true).unwrap();
        assert_eq!(tok.decode(&tokens), text, "{tail}");
    }
}

#[test]
fn an_extended_sequence_replaces_the_one_it_extends() {
    let seams = Seams::new();
    let seq = sampled();
    seams.remember(&seq);
    let mut longer = seq.clone();
    longer.extend(tokenizer().encode(NEXT, true).unwrap());
    seams.remember(&longer);
    assert_eq!(seams.len(), 1);
    seams.remember(&[1, 2, 3]);
    assert_eq!(seams.len(), 2);
}

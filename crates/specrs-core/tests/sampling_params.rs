//! Validation of per-request sampling parameters: each bad value is reported against the
//! field that holds it, with the accepted range in the message.

use specrs_core::sampling::SamplingParams;

const VOCAB: usize = 100;

#[test]
fn each_invalid_field_is_named_with_its_range() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str, &str)> = vec![
        (SamplingParams { temperature: -0.1, ..d() }, "temperature", "must be a finite number >= 0"),
        (SamplingParams { temperature: f32::NAN, ..d() }, "temperature", "got NaN"),
        (SamplingParams { temperature: f32::INFINITY, ..d() }, "temperature", "finite"),
        (SamplingParams { top_p: 0.0, ..d() }, "top_p", "top_p must be in (0, 1]"),
        (SamplingParams { top_p: 1.5, ..d() }, "top_p", "got 1.5"),
        (SamplingParams { min_p: -0.5, ..d() }, "min_p", "min_p must be in [0, 1]"),
        (SamplingParams { min_p: 1.01, ..d() }, "min_p", "got 1.01"),
        (SamplingParams { repetition_penalty: 0.0, ..d() }, "repetition_penalty", "must be a finite number > 0"),
        (SamplingParams { frequency_penalty: 2.5, ..d() }, "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
        (SamplingParams { presence_penalty: -3.0, ..d() }, "presence_penalty", "presence_penalty must be in [-2, 2]"),
        (SamplingParams { logprobs: Some(21), ..d() }, "logprobs", "logprobs must be <= 20, got 21"),
        (SamplingParams { max_tokens: Some(0), ..d() }, "max_tokens", "max_tokens must be >= 1"),
        (SamplingParams { max_tokens: Some(4), min_tokens: 5, ..d() }, "min_tokens", "must not exceed max_tokens"),
        (
            SamplingParams { stop_token_ids: vec![3, 100], ..d() },
            "stop_token_ids",
            "contains 100, outside the vocabulary of 100",
        ),
        (SamplingParams { stop: vec!["".into()], ..d() }, "stop", "must not be empty"),
    ];
    for (params, field, message) in cases {
        let err = params.validate(VOCAB).expect_err(field);
        assert_eq!(err.field.as_deref(), Some(field), "{}", err.message);
        assert!(err.message.contains(message), "{field}: '{}' lacks '{message}'", err.message);
    }
}

#[test]
fn boundary_values_are_accepted() {
    let d = SamplingParams::default;
    for params in [
        SamplingParams { temperature: 0.0, ..d() },
        SamplingParams { top_p: 1.0, min_p: 1.0, ..d() },
        SamplingParams { top_p: 1e-6, min_p: 0.0, ..d() },
        SamplingParams { frequency_penalty: -2.0, presence_penalty: 2.0, ..d() },
        SamplingParams { top_k: -1, ..d() },
        SamplingParams { top_k: 1_000_000, ..d() },
        SamplingParams { logprobs: Some(20), max_tokens: Some(1), min_tokens: 1, ..d() },
        SamplingParams { stop_token_ids: vec![99], stop: vec!["\n\n".into()], ..d() },
    ] {
        assert!(params.validate(VOCAB).is_ok(), "{params:?}");
    }
}

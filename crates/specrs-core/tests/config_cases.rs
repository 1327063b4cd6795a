//! Runs the shared configuration case table (tests/data/speculative_config_cases.json), the
//! same table pytest runs against the pydantic model.

use serde_json::Value;
use specrs_core::SpeculativeConfig;

fn table() -> Value {
    serde_json::from_str(include_str!("../../../tests/data/speculative_config_cases.json")).unwrap()
}

#[test]
fn construction_cases_accept_and_reject_as_tabled() {
    let table = table();
    for case in table["construction"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let result = SpeculativeConfig::from_json(&case["input"]).and_then(SpeculativeConfig::validated);
        match (&case.get("expect"), &case.get("error")) {
            (Some(expect), None) => {
                let cfg = result.unwrap_or_else(|e| panic!("{name}: expected success, got {e}"));
                let dumped = cfg.to_json();
                for (k, v) in expect.as_object().unwrap() {
                    assert_eq!(&dumped[k], v, "{name}: field {k}");
                }
            }
            (None, Some(error)) => {
                let e = result.err().unwrap_or_else(|| panic!("{name}: expected an error"));
                let contains = error["contains"].as_str().unwrap();
                assert!(e.message.contains(contains), "{name}: '{}' lacks '{contains}'", e.message);
                assert_eq!(e.field.as_deref(), error["field"].as_str(), "{name}: field");
            }
            _ => panic!("{name}: a case needs exactly one of expect/error"),
        }
    }
}

#[test]
fn pipeline_cases_reject_incompatible_rules() {
    let table = table();
    for case in table["pipeline"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let cfg = SpeculativeConfig::from_json(&case["input"])
            .and_then(SpeculativeConfig::validated)
            .unwrap_or_else(|e| panic!("{name}: constructs, got {e}"));
        let result = cfg.check_pipeline_combinations();
        match case["contains"].as_str() {
            None => assert!(result.is_ok(), "{name}: {result:?}"),
            Some(contains) => {
                let e = result.err().unwrap_or_else(|| panic!("{name}: expected an error"));
                assert!(e.message.contains(contains), "{name}: '{}' lacks '{contains}'", e.message);
            }
        }
    }
}

#[test]
fn json_round_trip_is_identity() {
    let cfg = SpeculativeConfig::from_json(&serde_json::json!({
        "speculative_method": "eagle",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [{"batch_start": 1, "batch_end": 8, "num_tokens": 2}],
    }))
    .unwrap()
    .validated()
    .unwrap();
    let back = SpeculativeConfig::from_json(&cfg.to_json()).unwrap();
    assert_eq!(cfg, back);
}

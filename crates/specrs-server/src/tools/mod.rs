//! Tool calling (OpenAI's `tools` and `tool_choice`), served the way vLLM serves it.
//!
//! A named function or `"required"` rides structured outputs: the output is the function's
//! arguments (its `parameters` schema), or a JSON list of `{"name", "parameters"}` calls, one
//! schema branch per tool. `"auto"` lets the model answer or call, and reads the calls it
//! writes in its own format through the parser the server was started with
//! (`--enable-auto-tool-choice --tool-call-parser hermes`). The tools themselves reach the
//! model through the chat template (`tools`), as with transformers and vLLM.

pub mod calls;
pub mod harmony;
pub mod marked_calls;
pub mod pythonic;
pub mod xml_calls;

use serde_json::{Map, Value, json};
use specrs_core::structured::StructuredOutputs;
use specrs_core::structured::json_schema::schema_to_regex;

use crate::error::ApiError;

pub use calls::{CallIds, CallStream};

/// The formats of tool calls a model may write on its own, for `tool_choice: "auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5 / 3; ERNIE 4.5's
    /// thinking models write the same, `ernie45`).
    Hermes,
    /// `<|python_tag|>{"name": ..., "parameters": {...}}; {...}` (Llama 3.1 / 3.2 JSON).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo, Small), or
    /// `[TOOL_CALLS]name[ARGS]{...}` (Mistral Small 3.2, Magistral, Devstral); call ids of nine
    /// letters and digits, as Mistral's templates require.
    Mistral,
    /// `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]` (IBM Granite 3.0; `<tool_call>`
    /// from 3.1).
    Granite,
    /// `[get_weather(city="Paris"), get_time()]`, arguments as Python literals (Llama 3.2 / 4,
    /// whose `<|python_start|>`/`<|python_end|>` around the list are skipped).
    Pythonic,
    /// `<tool_call><function=name><parameter=key>value</parameter></function></tool_call>`
    /// (Qwen3-Coder), values typed by the tool's schema.
    Qwen3Coder,
    /// Qwen3-Coder's functions inside `<seed:tool_call>...</seed:tool_call>` (Seed-OSS).
    SeedOss,
    /// `<minimax:tool_call><invoke name="f"><parameter name="k">v</parameter></invoke>...`
    /// (MiniMax-M2), values typed by the tool's schema.
    MinimaxM2,
    /// `<tool_call>name<arg_key>key</arg_key><arg_value>value</arg_value></tool_call>` (GLM-4.5,
    /// line breaks between the parts; GLM-4.7 without: `glm45` and `glm47` name one reader),
    /// values typed by the tool's schema.
    Glm,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁sep｜>...` (DeepSeek V3, R1-0528 and
    /// V3.1: `deepseek_v3` and `deepseek_v31` name the same reader, which reads both layouts).
    DeepSeek,
    /// `<tool_calls>[{...}, ...]</tool_calls>` (Jamba, Hunyuan-A13B) or one call object a line
    /// (MiniMax): `jamba`, `hunyuan_a13b` and `minimax` name one reader.
    ToolCallsBlock,
    /// `<longcat_tool_call>{"name": ..., "arguments": {...}}</longcat_tool_call>` (LongCat-Flash).
    Longcat,
    /// `<|action_start|><|plugin|>{"name", "parameters"}<|action_end|>` (InternLM2, `internlm`).
    Internlm,
    /// `functools[{"name", "arguments"}, ...]` (Phi-4-mini, `phi4_mini_json`).
    Phi4Mini,
    /// `<function_call> {"name", "arguments"}`, the marker before each call (IBM's
    /// granite-20b-functioncalling, `granite-20b-fc`).
    Granite20bFc,
    /// `<function_calls>\nget_weather(city="Paris")\nget_time()\n</function_calls>`: Python-style
    /// calls a line each (OLMo 3, `olmo3`).
    Olmo3,
    /// Salesforce xLAM: `[{"name", "arguments"}, ...]` bare at the start, or in a JSON code
    /// fence, after `[TOOL_CALLS]` or in `<tool_call>` tags (`xlam`).
    Xlam,
    /// `<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="f">
    /// <steptml:parameter name="k">v</steptml:parameter></steptml:invoke>...` (StepFun's Step 3),
    /// values typed by the tool's schema.
    Step3,
    /// gpt-oss's harmony messages: a `commentary` message `to=functions.name` is a call, the
    /// `analysis` channel reasoning, `final` the answer (`openai`).
    Openai,
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}`
    /// (Kimi K2), the model's `functions.name:0` kept as the call's id.
    KimiK2,
}

impl ToolCallParser {
    pub const NAMES: [&str; 28] = [
        "hermes",
        "llama3_json",
        "llama4_json",
        "mistral",
        "granite",
        "pythonic",
        "llama4_pythonic",
        "qwen3_coder",
        "qwen3_xml",
        "seed_oss",
        "minimax_m2",
        "glm45",
        "glm47",
        "deepseek_v3",
        "deepseek_v31",
        "kimi_k2",
        "openai",
        "jamba",
        "hunyuan_a13b",
        "minimax",
        "longcat",
        "internlm",
        "phi4_mini_json",
        "granite-20b-fc",
        "ernie45",
        "xlam",
        "step3",
        "olmo3",
    ];

    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            // ERNIE 4.5's calls are Hermes's blocks (its `<response>` wrapper is the `ernie45`
            // reasoning parser's to leave out).
            "hermes" | "ernie45" => Ok(Self::Hermes),
            // vLLM's Llama 4 names read Llama 3's JSON and the Python lists Llama 4 writes.
            "llama3_json" | "llama4_json" => Ok(Self::Llama3Json),
            "mistral" => Ok(Self::Mistral),
            "granite" => Ok(Self::Granite),
            "pythonic" | "llama4_pythonic" => Ok(Self::Pythonic),
            // vLLM's second Qwen3-Coder reader names the same format.
            "qwen3_coder" | "qwen3_xml" => Ok(Self::Qwen3Coder),
            "seed_oss" => Ok(Self::SeedOss),
            "minimax_m2" => Ok(Self::MinimaxM2),
            "glm45" | "glm47" => Ok(Self::Glm),
            "deepseek_v3" | "deepseek_v31" => Ok(Self::DeepSeek),
            "kimi_k2" => Ok(Self::KimiK2),
            "openai" => Ok(Self::Openai),
            "jamba" | "hunyuan_a13b" | "minimax" => Ok(Self::ToolCallsBlock),
            "longcat" => Ok(Self::Longcat),
            "internlm" => Ok(Self::Internlm),
            "phi4_mini_json" => Ok(Self::Phi4Mini),
            "granite-20b-fc" => Ok(Self::Granite20bFc),
            "xlam" => Ok(Self::Xlam),
            "step3" => Ok(Self::Step3),
            "olmo3" => Ok(Self::Olmo3),
            other => Err(format!("unknown tool call parser '{other}'; available: {}", Self::NAMES.join(", "))),
        }
    }
}

/// One function a request offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    /// Its arguments' JSON schema (an object with no properties when the tool gives none).
    pub parameters: Value,
}

/// What a request lets the model do with its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Answer in text; no call is parsed.
    None,
    /// Answer or call, as the model decides; calls are read by the server's parser.
    Auto(ToolCallParser),
    /// Call one or more of the tools (`parallel_tool_calls: false`: exactly one).
    Required { parallel: bool },
    /// Call this function, once.
    Function(String),
}

/// A request's tools, as the template gets them, and the choice it made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The `tools` list as sent, for the chat template.
    pub tools: Vec<Value>,
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// How call ids are written: Mistral's form on a server that reads Mistral calls.
    pub ids: CallIds,
    /// `parallel_tool_calls` (default true): false makes the model's first call the only one.
    pub parallel_calls: bool,
}

impl ToolRequest {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls`. `None` when the request offers no
    /// tools and asks for no call. `auto_parser` is the server's parser for `"auto"`, if any.
    pub fn parse(
        tools: Option<&Value>,
        tool_choice: Option<&Value>,
        parallel_tool_calls: Option<bool>,
        auto_parser: Option<ToolCallParser>,
    ) -> Result<Option<Self>, ApiError> {
        let (tools, functions) = match tools {
            None | Some(Value::Null) => (Vec::new(), Vec::new()),
            Some(Value::Array(list)) => {
                let functions =
                    list.iter().enumerate().map(|(i, t)| function_of(t, i)).collect::<Result<Vec<_>, _>>()?;
                for (i, f) in functions.iter().enumerate() {
                    if functions[..i].iter().any(|g| g.name == f.name) {
                        return Err(bad(format!("tool name '{}' is given twice", f.name), &format!("tools[{i}]")));
                    }
                }
                (list.clone(), functions)
            }
            Some(_) => {
                return Err(bad("tools must be a list of {\"type\": \"function\", \"function\": {...}}", "tools"));
            }
        };
        let choice = match tool_choice {
            None | Some(Value::Null) if functions.is_empty() => return Ok(None),
            None | Some(Value::Null) => auto_choice(auto_parser, "tools")?,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" if functions.is_empty() => return Ok(None),
                "auto" => auto_choice(auto_parser, "tool_choice")?,
                "required" => ToolChoice::Required { parallel: parallel_tool_calls.unwrap_or(true) },
                other => {
                    return Err(bad(
                        format!(
                            "tool_choice '{other}' is not one of 'none', 'auto', 'required', or \
                             {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                        ),
                        "tool_choice",
                    ));
                }
            },
            Some(named) => {
                let name = named
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| named.get("type").and_then(Value::as_str).is_none_or(|t| t == "function"))
                    .ok_or_else(|| {
                        bad(
                            "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                            "tool_choice",
                        )
                    })?;
                if !functions.iter().any(|f| f.name == name) {
                    return Err(bad(format!("tool_choice names '{name}', which is not among tools"), "tool_choice"));
                }
                ToolChoice::Function(name.to_string())
            }
        };
        if functions.is_empty() && matches!(choice, ToolChoice::Required { .. }) {
            return Err(bad("tool_choice 'required' needs tools to call", "tool_choice"));
        }
        let ids = if auto_parser == Some(ToolCallParser::Mistral) { CallIds::Mistral } else { CallIds::OpenAi };
        Ok(Some(Self { tools, functions, choice, ids, parallel_calls: parallel_tool_calls.unwrap_or(true) }))
    }

    /// The output constraint the choice imposes: a named function's arguments, or the list of
    /// calls `"required"` asks for. `None` for `"none"` and `"auto"`.
    pub fn constraint(&self) -> Result<Option<StructuredOutputs>, ApiError> {
        let schema = match &self.choice {
            ToolChoice::None | ToolChoice::Auto(_) => return Ok(None),
            ToolChoice::Function(name) => {
                self.functions.iter().find(|f| &f.name == name).expect("checked at parse").parameters.clone()
            }
            ToolChoice::Required { parallel } => self.calls_schema(*parallel)?,
        };
        Ok(Some(StructuredOutputs { json: Some(schema), ..Default::default() }))
    }

    /// `[{"name": <one tool>, "parameters": <its arguments>}, ...]`, with every tool's `$defs`
    /// (and `definitions`) moved to the root so their local `$ref`s still resolve.
    fn calls_schema(&self, parallel: bool) -> Result<Value, ApiError> {
        let mut roots: Map<String, Value> = Map::new();
        let mut branches = Vec::with_capacity(self.functions.len());
        for (i, f) in self.functions.iter().enumerate() {
            let mut parameters = f.parameters.clone();
            for key in ["$defs", "definitions"] {
                let Some(Value::Object(defs)) = parameters.as_object_mut().and_then(|p| p.remove(key)) else {
                    continue;
                };
                let merged = roots.entry(key).or_insert_with(|| json!({})).as_object_mut().expect("an object");
                for (name, schema) in defs {
                    match merged.get(&name) {
                        Some(existing) if existing != &schema => {
                            return Err(bad(
                                format!(
                                    "two tools define '{key}/{name}' differently; tool_choice 'required' puts \
                                     every tool in one schema, so give them distinct names"
                                ),
                                &format!("tools[{i}].function.parameters.{key}.{name}"),
                            ));
                        }
                        _ => merged.insert(name, schema),
                    };
                }
            }
            branches.push(json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, "parameters": parameters},
                "required": ["name", "parameters"],
            }));
        }
        let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": branches}});
        if !parallel {
            schema["maxItems"] = json!(1);
        }
        schema.as_object_mut().expect("an object").extend(roots);
        Ok(schema)
    }

    /// A reader of one choice's output into the message's content and tool calls.
    pub fn call_stream(&self) -> CallStream {
        let stream = match &self.choice {
            ToolChoice::None => CallStream::text(),
            ToolChoice::Auto(ToolCallParser::Hermes) => CallStream::hermes(),
            ToolChoice::Auto(ToolCallParser::Llama3Json) => CallStream::llama_json(),
            ToolChoice::Auto(ToolCallParser::Mistral) => CallStream::mistral(),
            ToolChoice::Auto(ToolCallParser::Granite) => CallStream::granite(),
            ToolChoice::Auto(ToolCallParser::Pythonic) => CallStream::pythonic(),
            ToolChoice::Auto(ToolCallParser::Qwen3Coder) => CallStream::qwen3_coder(&self.functions),
            ToolChoice::Auto(ToolCallParser::SeedOss) => CallStream::seed_oss(&self.functions),
            ToolChoice::Auto(ToolCallParser::MinimaxM2) => CallStream::minimax_m2(&self.functions),
            ToolChoice::Auto(ToolCallParser::Glm) => CallStream::glm(&self.functions),
            ToolChoice::Auto(ToolCallParser::DeepSeek) => CallStream::deepseek(),
            ToolChoice::Auto(ToolCallParser::KimiK2) => CallStream::kimi(),
            ToolChoice::Auto(ToolCallParser::Openai) => CallStream::harmony(true),
            ToolChoice::Auto(ToolCallParser::ToolCallsBlock) => CallStream::blocks(&[calls::TOOL_CALLS]),
            ToolChoice::Auto(ToolCallParser::Longcat) => CallStream::blocks(&[calls::LONGCAT]),
            ToolChoice::Auto(ToolCallParser::Internlm) => CallStream::blocks(&[calls::INTERNLM]),
            ToolChoice::Auto(ToolCallParser::Phi4Mini) => CallStream::blocks(&[calls::PHI4_MINI]),
            ToolChoice::Auto(ToolCallParser::Granite20bFc) => CallStream::blocks(&[calls::GRANITE_20B_FC]),
            ToolChoice::Auto(ToolCallParser::Xlam) => CallStream::xlam(),
            ToolChoice::Auto(ToolCallParser::Olmo3) => CallStream::olmo3(),
            ToolChoice::Auto(ToolCallParser::Step3) => CallStream::step3(&self.functions),
            ToolChoice::Required { .. } => CallStream::call_list(),
            ToolChoice::Function(name) => CallStream::named(name),
        };
        let stream = stream.with_ids(self.ids);
        if self.parallel_calls { stream } else { stream.first_call_only() }
    }

    /// Whether the model's own tool-call markers must stay in the text for the parser to see
    /// (Qwen's `<tool_call>`, Llama's `<|python_tag|>`, Mistral's `[TOOL_CALLS]` are special
    /// tokens).
    pub fn keeps_special_tokens(&self) -> bool {
        matches!(self.choice, ToolChoice::Auto(_))
    }

    /// Whether the response's `finish_reason` reports `tool_calls` when the model stopped after
    /// calling: for `"required"` and `"auto"`, not for a named function (as OpenAI does).
    pub fn reports_tool_calls(&self) -> bool {
        matches!(self.choice, ToolChoice::Required { .. } | ToolChoice::Auto(_))
    }
}

/// Test support for the readers: the reasoning, content and calls (name, arguments) a run of
/// deltas adds up to, each call's start checked to come in index order.
#[cfg(test)]
fn gather(deltas: &[crate::message::MessageDelta]) -> (String, String, Vec<(String, String)>) {
    use crate::message::MessageDelta;
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::<(String, String)>::new());
    for d in deltas {
        match d {
            MessageDelta::Reasoning(t) => reasoning.push_str(t),
            MessageDelta::Content(t) => content.push_str(t),
            MessageDelta::CallStart { index, name, .. } => {
                assert_eq!(*index, calls.len(), "calls start in index order");
                calls.push((name.clone(), String::new()));
            }
            MessageDelta::Arguments { index, text } => calls[*index].1.push_str(text),
        }
    }
    (reasoning, content, calls)
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

fn auto_choice(parser: Option<ToolCallParser>, field: &str) -> Result<ToolChoice, ApiError> {
    parser.map(ToolChoice::Auto).ok_or_else(|| {
        bad(
            "tool_choice 'auto' (the default when tools are given) needs the server started with \
             --enable-auto-tool-choice and --tool-call-parser; or send tool_choice 'required', a named function, \
             or 'none'",
            field,
        )
    })
}

/// Checks one entry of `tools` and reads its function.
fn function_of(tool: &Value, index: usize) -> Result<Function, ApiError> {
    let at = format!("tools[{index}]");
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(bad(format!("tool type '{other}' is not supported; tools must be of type 'function'"), &at));
        }
        None => return Err(bad("a tool needs \"type\": \"function\"", &at)),
    }
    let function = tool
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("a tool needs a \"function\" object", &format!("{at}.function")))?;
    let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(bad(
            format!("function name {name:?} must be 1 to 64 letters, digits, underscores or dashes"),
            &format!("{at}.function.name"),
        ));
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(bad("parameters must be a JSON schema object", &format!("{at}.function.parameters"))),
    };
    // Checked here, so a schema the constraint cannot keep is refused naming its tool.
    schema_to_regex(&parameters).map_err(|e| bad(e.to_string(), &format!("{at}.function.parameters")))?;
    Ok(Function { name: name.to_string(), parameters })
}

#[cfg(test)]
mod tests {
    use super::*;
    use specrs_core::structured::regex_dfa::RegexGrammar;

    fn weather_and_time() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time"}},
        ])
    }

    fn parse(choice: Value) -> Result<Option<ToolRequest>, ApiError> {
        ToolRequest::parse(Some(&weather_and_time()), Some(&choice), None, None)
    }

    #[test]
    fn parallel_tool_calls_false_under_auto_reads_one_call() {
        let text = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
        let names = |parallel: Option<bool>| {
            let request = ToolRequest::parse(Some(&weather_and_time()), None, parallel, Some(ToolCallParser::Hermes))
                .unwrap()
                .unwrap();
            let message = crate::message::MessageReader::new(None, true, request.call_stream()).read_all(text);
            message.tool_calls.into_iter().map(|(_, name, _)| name).collect::<Vec<_>>()
        };
        assert_eq!(names(None), ["get_time", "get_weather"]);
        assert_eq!(names(Some(false)), ["get_time"]);
    }

    fn matches(schema: &Value, text: &str) -> bool {
        RegexGrammar::new(&schema_to_regex(schema).unwrap()).unwrap().matches(text.as_bytes())
    }

    #[test]
    fn vllms_other_names_for_the_same_formats_read_them() {
        for (alias, parser) in [
            ("llama4_json", ToolCallParser::Llama3Json),
            ("llama4_pythonic", ToolCallParser::Pythonic),
            ("qwen3_xml", ToolCallParser::Qwen3Coder),
            ("hunyuan_a13b", ToolCallParser::ToolCallsBlock),
            ("ernie45", ToolCallParser::Hermes),
        ] {
            assert_eq!(ToolCallParser::parse(alias), Ok(parser), "{alias}");
            assert!(ToolCallParser::NAMES.contains(&alias), "{alias} is offered on the command line");
        }
    }

    #[test]
    fn choices_read_as_openai_defines_them() {
        assert_eq!(parse(json!("none")).unwrap().unwrap().choice, ToolChoice::None);
        assert_eq!(parse(json!("required")).unwrap().unwrap().choice, ToolChoice::Required { parallel: true });
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        assert_eq!(parse(named).unwrap().unwrap().choice, ToolChoice::Function("get_time".into()));
        let auto = ToolRequest::parse(Some(&weather_and_time()), None, None, Some(ToolCallParser::Hermes));
        assert_eq!(auto.unwrap().unwrap().choice, ToolChoice::Auto(ToolCallParser::Hermes));
        // No tools and nothing asked: plain chat.
        assert_eq!(ToolRequest::parse(None, Some(&json!("auto")), None, None).unwrap(), None);
        assert_eq!(ToolRequest::parse(Some(&json!([])), None, None, None).unwrap(), None);
    }

    #[test]
    fn bad_tools_and_choices_are_refused_naming_the_field() {
        let cases = [
            (json!("sometimes"), "tool_choice", "is not one of"),
            (json!({"type": "function", "function": {"name": "fly"}}), "tool_choice", "not among tools"),
            (json!({"function": {}}), "tool_choice", "named tool_choice"),
        ];
        for (choice, param, message) in cases {
            let e = parse(choice).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param));
            assert!(e.message.contains(message), "{}", e.message);
        }
        let auto = ToolRequest::parse(Some(&weather_and_time()), None, None, None).unwrap_err();
        assert!(auto.message.contains("--enable-auto-tool-choice"), "{}", auto.message);
        let required = ToolRequest::parse(None, Some(&json!("required")), None, None).unwrap_err();
        assert!(required.message.contains("needs tools"), "{}", required.message);
        let tools = [
            (json!({"type": "custom"}), "tools[0]"),
            (json!({"type": "function"}), "tools[0].function"),
            (json!({"type": "function", "function": {"name": "no spaces"}}), "tools[0].function.name"),
            (json!({"type": "function", "function": {"name": "f", "parameters": 3}}), "tools[0].function.parameters"),
            (
                json!({"type": "function", "function": {"name": "f", "parameters": {"type": "array", "uniqueItems": true}}}),
                "tools[0].function.parameters",
            ),
        ];
        for (tool, param) in tools {
            let e = ToolRequest::parse(Some(&json!([tool])), Some(&json!("required")), None, None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
        let twice =
            json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]);
        assert_eq!(ToolRequest::parse(Some(&twice), None, None, None).unwrap_err().param.as_deref(), Some("tools[1]"));
    }

    #[test]
    fn a_named_function_constrains_the_output_to_its_arguments() {
        let named = parse(json!({"type": "function", "function": {"name": "get_weather"}})).unwrap().unwrap();
        let schema = named.constraint().unwrap().unwrap().json.unwrap();
        assert!(matches(&schema, r#"{"city": "Paris"}"#));
        assert!(!matches(&schema, r#"{"town": "Paris"}"#));
        assert!(!named.reports_tool_calls());
    }

    #[test]
    fn required_allows_a_list_of_calls_to_any_tool_with_its_own_arguments() {
        let required = parse(json!("required")).unwrap().unwrap();
        let schema = required.constraint().unwrap().unwrap().json.unwrap();
        assert!(matches(&schema, r#"[{"name": "get_weather", "parameters": {"city": "Oslo"}}]"#));
        assert!(matches(
            &schema,
            r#"[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]"#
        ));
        assert!(!matches(&schema, "[]"), "at least one call");
        assert!(!matches(&schema, r#"[{"name": "get_time", "parameters": {"city": "Rome"}, "x": 1}]"#));
        assert!(!matches(&schema, r#"[{"name": "get_weather", "parameters": {}}]"#), "city is required");
        let single = ToolRequest::parse(Some(&weather_and_time()), Some(&json!("required")), Some(false), None);
        let schema = single.unwrap().unwrap().constraint().unwrap().unwrap().json.unwrap();
        assert!(!matches(
            &schema,
            r#"[{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}]"#
        ));
    }

    #[test]
    fn definitions_of_every_tool_move_to_the_root_and_clashes_are_refused() {
        let with_defs = |name: &str, unit: Value| {
            json!({"type": "function", "function": {"name": name, "parameters": {
                "type": "object", "properties": {"t": {"$ref": "#/$defs/unit"}}, "required": ["t"],
                "$defs": {"unit": unit}}}})
        };
        let same = json!([with_defs("a", json!({"enum": ["C", "F"]})), with_defs("b", json!({"enum": ["C", "F"]}))]);
        let request = ToolRequest::parse(Some(&same), Some(&json!("required")), None, None).unwrap().unwrap();
        let schema = request.constraint().unwrap().unwrap().json.unwrap();
        assert!(matches(&schema, r#"[{"name": "b", "parameters": {"t": "F"}}]"#));
        let clash = json!([with_defs("a", json!({"enum": ["C"]})), with_defs("b", json!({"enum": ["K"]}))]);
        let request = ToolRequest::parse(Some(&clash), Some(&json!("required")), None, None).unwrap().unwrap();
        let e = request.constraint().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[1].function.parameters.$defs.unit"));
    }
}

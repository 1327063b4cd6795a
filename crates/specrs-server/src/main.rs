fn main() {
    std::process::exit(specrs_server::main_with_args(std::env::args_os().skip(1), None));
}

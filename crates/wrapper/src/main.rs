fn main() {
    eprintln!("sdns: not built yet");
    std::process::exit(2);
}

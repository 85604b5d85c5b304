// libFuzzer entry point for the encrypted transport's parsers and openers
// (SecureFuzzChecks.exercise): media and control packets, and the Noise IK
// responder. Built and run like STUNFuzz (see that file and scripts/fuzz.sh):
// with -DFUZZING libFuzzer drives it; a plain build replays files given as
// arguments, so a crash reproduces with `swift run SecureFuzz crash-…`.
import Foundation
import Secure

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    SecureFuzzChecks.exercise(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

#if FUZZING
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
) -> CInt
#endif

@main
struct SecureFuzz {
    static func main() {
        #if FUZZING
        var argc = CommandLine.argc
        var argv = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv, { data, size in fuzzOneInput(data, size) }))
        #else
        let paths = CommandLine.arguments.dropFirst()
        if paths.isEmpty {
            print("usage: SecureFuzz FILE... (replays inputs through the fuzz checks)")
        }
        for path in paths {
            guard let data = FileManager.default.contents(atPath: path) else {
                print("\(path): cannot read")
                continue
            }
            SecureFuzzChecks.exercise(Array(data))
            print("\(path): ok")
        }
        #endif
    }
}

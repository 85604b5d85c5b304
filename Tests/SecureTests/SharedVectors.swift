import Foundation
import Testing

@testable import Secure

/// Locates `../shared/vectors` beside the project (from this file's path).
/// Tests that need it are disabled with a clear message when it is absent.
enum SharedVectors {
    static let root: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("shared/vectors")

    static let noiseFile = root.appendingPathComponent("noise-25519-chachapoly.json")
    static var noisePresent: Bool { FileManager.default.fileExists(atPath: noiseFile.path) }
    static let noiseAbsent: Comment = "../shared/vectors/noise-25519-chachapoly.json is absent: Noise vector tests skipped"

    struct NoiseMessage: Decodable, Sendable {
        let payload: String
        let ciphertext: String
    }

    // The cacophony file's own field names.
    // swift-format-ignore: AlwaysUseLowerCamelCase
    struct NoiseVector: Decodable, Sendable, CustomTestStringConvertible {
        let protocol_name: String
        let init_prologue: String
        let init_ephemeral: String
        let init_static: String?
        let init_remote_static: String?
        let init_psks: [String]?
        let resp_prologue: String
        let resp_static: String?
        let resp_ephemeral: String
        let resp_psks: [String]?
        let handshake_hash: String
        let messages: [NoiseMessage]

        var testDescription: String { protocol_name }
    }

    private struct NoiseFile: Decodable { let vectors: [NoiseVector] }

    /// Every vector in the file (empty when the file is absent).
    static let noiseVectors: [NoiseVector] = {
        guard let data = try? Data(contentsOf: noiseFile),
            let file = try? JSONDecoder().decode(NoiseFile.self, from: data)
        else { return [] }
        return file.vectors
    }()
}

func hex(_ s: String) -> [UInt8] { Hex.decode(s) ?? [] }

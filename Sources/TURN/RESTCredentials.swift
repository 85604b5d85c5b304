import Crypto
import Foundation
import STUN

/// coturn-compatible ephemeral ("REST API") TURN credentials: the username is
/// `expiry[:user]` (expiry in Unix seconds) and the password is
/// `base64(HMAC-SHA1(secret, username))` (coturn's `--use-auth-secret`).
public enum RESTCredentials {
    /// The password a server with `secret` expects for `username`.
    public static func password(secret: String, username: String) -> String {
        let mac = HMAC<Insecure.SHA1>.authenticationCode(for: Array(username.utf8), using: SymmetricKey(data: Array(secret.utf8)))
        return Data(mac).base64EncodedString()
    }

    /// The expiry time in a REST username (`1700000000:alice` or `1700000000`), if it has one.
    public static func expiry(of username: String) -> UInt64? {
        UInt64(username.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).first ?? "")
    }

    /// A username valid until `expiry` for `user`, with its password.
    public static func make(secret: String, user: String?, expiry: UInt64) -> (username: String, password: String) {
        let username = user.map { "\(expiry):\($0)" } ?? "\(expiry)"
        return (username, password(secret: secret, username: username))
    }
}

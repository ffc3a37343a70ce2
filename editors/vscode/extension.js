const { LanguageClient } = require("vscode-languageclient/node");
let client;
exports.activate = () => {
  client = new LanguageClient("nfc", "nfc", { command: "nfc", args: ["lsp"] },
                              { documentSelector: [{ language: "nf" }] });
  client.start();
};
exports.deactivate = () => client && client.stop();

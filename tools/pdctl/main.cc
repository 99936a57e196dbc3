// pdctl: the pdserve command line. Subcommands: generate, chat, tokenize, logits, models, bench,
// quantize, convert, texts, synth-model, plan, up; each in its own X_cmd.{h,cc}. This file assembles them
// into one CLI app and runs the one given.
#include "CLI/CLI.hpp"
#include "common/cli_parse.h"
#include "tools/pdctl/bench_cmd.h"
#include "tools/pdctl/chat_cmd.h"
#include "tools/pdctl/convert_cmd.h"
#include "tools/pdctl/generate_cmd.h"
#include "tools/pdctl/logits_cmd.h"
#include "tools/pdctl/models_cmd.h"
#include "tools/pdctl/plan_cmd.h"
#include "tools/pdctl/quantize_cmd.h"
#include "tools/pdctl/synth_model_cmd.h"
#include "tools/pdctl/tokenize_cmd.h"
#include "tools/pdctl/up_cmd.h"

int main(int argc, char** argv) {
  using namespace pd::tools;
  CLI::App app{"pdctl: pdserve's command line (generate text, tokenize, dump logits, quantize)"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();

  // The order of `pdctl --help`.
  GenerateFlags g;
  CLI::App* gen = AddGenerateCommand(app, &g);
  LogitsFlags lf;
  CLI::App* lg = AddLogitsCommand(app, &lf);
  TokenizeFlags tkf;
  CLI::App* tk = AddTokenizeCommand(app, &tkf);
  CLI::App* models = AddModelsCommand(app);
  ChatFlags cf;
  CLI::App* chat = AddChatCommand(app, &cf);
  BenchFlags bf;
  CLI::App* bench = AddBenchCommand(app, &bf);
  QuantizeFlags qf;
  CLI::App* qz = AddQuantizeCommand(app, &qf);
  ConvertFlags cvf;
  CLI::App* cv = AddConvertCommand(app, &cvf);
  TextsFlags txf;
  CLI::App* tx = AddTextsCommand(app, &txf);
  SynthModelFlags smf;
  CLI::App* sm = AddSynthModelCommand(app, &smf);
  PlanFlags pf;
  CLI::App* plan = AddPlanCommand(app, &pf);
  UpFlags uf;
  CLI::App* up = AddUpCommand(app, &uf);

  if (const int rc = pd::ParseFlags(app, argc, argv); rc >= 0) return rc;
  if (up->parsed()) return RunUp(uf);
  if (qz->parsed()) return RunQuantize(qf);
  if (cv->parsed()) return RunConvert(cvf);
  if (tx->parsed()) return RunTexts(txf);
  if (sm->parsed()) return RunSynthModel(smf);
  if (plan->parsed()) return RunPlan(pf);
  if (models->parsed()) return RunModels();
  if (bench->parsed()) return RunBench(bf);
  if (chat->parsed()) return RunChat(cf);
  if (gen->parsed()) return RunGenerate(g);
  if (lg->parsed()) return RunLogits(lf);
  if (tk->parsed()) return RunTokenize(tkf);
  return 0;
}

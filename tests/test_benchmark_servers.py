"""The serving benchmarks' server specs: what `serve_config.yaml` the A/B's sides really run."""

from __future__ import annotations

import yaml

from benchmarks.servers import ServerSpec, _specserve_command


def test_overrides_reach_app_arguments_and_top_level_keys(tmp_path):
    spec = ServerSpec.parse("specserve:speculative_method=null,serve.controller_options=null,max_num_seqs=8")
    command, _env, _cwd = _specserve_command(spec, 8123, tmp_path)
    config = yaml.safe_load((tmp_path / "serve_config.yaml").read_text())
    assert command[-1] == str(tmp_path / "serve_config.yaml")
    assert config["http_options"]["port"] == 8123
    assert "controller_options" not in config  # the Python proxy instead of HAProxy
    args = config["applications"][0]["args"]
    assert args["speculative_method"] is None and args["max_num_seqs"] == 8
    assert "serve.controller_options" not in args


def test_a_dotted_top_level_key_sets_one_nested_value(tmp_path):
    spec = ServerSpec.parse("specserve:serve.controller_options.runtime_env.env_vars.RAY_SERVE_X=\"0.5\"")
    _specserve_command(spec, 8123, tmp_path)
    env_vars = yaml.safe_load((tmp_path / "serve_config.yaml").read_text())["controller_options"]["runtime_env"]["env_vars"]
    assert env_vars["RAY_SERVE_X"] == "0.5" and env_vars["RAY_SERVE_ENABLE_HA_PROXY"] == "1"  # beside the others


def test_a_number_in_the_path_picks_a_list_item(tmp_path):
    spec = ServerSpec.parse("specserve:serve.applications.0.deployments.0.ray_actor_options.num_cpus=1")
    _specserve_command(spec, 8123, tmp_path)
    ingress = yaml.safe_load((tmp_path / "serve_config.yaml").read_text())["applications"][0]["deployments"][0]
    assert ingress["name"] == "Ingress" and ingress["ray_actor_options"]["num_cpus"] == 1


def test_without_overrides_the_shipped_config_runs_as_it_is(tmp_path):
    _specserve_command(ServerSpec.parse("specserve"), 8123, tmp_path)
    config = yaml.safe_load((tmp_path / "serve_config.yaml").read_text())
    assert config["controller_options"]["runtime_env"]["env_vars"]["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert config["applications"][0]["args"]["speculative_method"] == "ngram"
